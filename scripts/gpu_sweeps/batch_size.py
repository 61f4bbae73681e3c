"""One-off: gpu_check's train rows warm (after a discarded warm-up), at two batch sizes."""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, "scripts")
import gpu_check

out = Path(sys.argv[1])
base = Path(".gpu/project")
gpu_check.train_rows(base, 60, Path(tempfile.mkdtemp()))  # warm-up, discarded
rows = []
for tokens in (3000, 24000):
    root = Path(tempfile.mkdtemp()) / "p"
    shutil.copytree(base, root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["max_tokens"] = tokens
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for row in gpu_check.train_rows(root, 400, Path(tempfile.mkdtemp())):
        rows.append({"max_tokens": tokens, **row})
        print(json.dumps(rows[-1]), flush=True)
out.write_text(json.dumps(rows, indent=2) + "\n")
