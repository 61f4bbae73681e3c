"""One-off: the default model (7.6M) with TF32 matmuls, bf16 vs fp32, 3k and 24k tokens."""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import yaml

sys.path.insert(0, "scripts")
import gpu_check

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
gpu_check.train_rows(Path(".gpu/project"), 60, Path(tempfile.mkdtemp()))  # warm-up, discarded
rows = []
for tokens in (3000, 24000):
    root = Path(tempfile.mkdtemp()) / "p"
    shutil.copytree(Path(".gpu/project"), root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["max_tokens"] = tokens
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rows += [{"tf32": True, "max_tokens": tokens, **r}
             for r in gpu_check.train_rows(root, 300, Path(tempfile.mkdtemp()))]
for r in rows:
    print(json.dumps(r), flush=True)
Path(sys.argv[1]).write_text(json.dumps(rows, indent=2) + "\n")
