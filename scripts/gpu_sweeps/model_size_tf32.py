"""One-off: gpu_check's train rows on a larger model (d_model 512, 6+6 layers), 24k tokens:
bf16 autocast, fp32, fp32 with TF32 matmuls."""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import yaml

sys.path.insert(0, "scripts")
import gpu_check

out = Path(sys.argv[1])
root = Path(tempfile.mkdtemp()) / "p"
shutil.copytree(Path(".gpu/project"), root)
params = yaml.safe_load((root / "params.yaml").read_text())
params["train"]["max_tokens"] = 24000
params["model"].update(d_model=512, n_heads=8, n_layers=6, ffn_dim=2048)
(root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
gpu_check.train_rows(root, 40, Path(tempfile.mkdtemp()))  # warm-up, discarded
rows = [{"tf32": False, **r} for r in gpu_check.train_rows(root, 300, Path(tempfile.mkdtemp()))]
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
rows += [{"tf32": True, **r} for r in gpu_check.train_rows(root, 300, Path(tempfile.mkdtemp()))]
for r in rows:
    print(json.dumps(r), flush=True)
out.write_text(json.dumps(rows, indent=2) + "\n")
