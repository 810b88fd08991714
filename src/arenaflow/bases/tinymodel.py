"""Build the embedded default base model: a tiny Llama pretrained on synthetic arithmetic chats.

    python -m arenaflow.bases.tinymodel --out models/tiny-arith

Byte-level tokenizer (256 bytes + ChatML specials, built offline with `tokenizers`), a ~0.5 M
parameter LlamaForCausalLM, trained from scratch with AdamW on the *train* split of the synthetic
generator in arenaflow.pools.math. Every `--eval-every` steps it measures pass@1 at T=0.8 on
eval-split problems and keeps the first checkpoint inside [--min-pass, --max-pass], the regime where
rejection sampling has something to select. The result is shipped in the repo with its sha256
(models/tiny-arith/BUILD.json); rebuilding takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

import torch

from arenaflow import chat, io, manifest, verify
from arenaflow.decode import sampling
from arenaflow.pools import math as mathpool

SYSTEM_PROMPT = "You are a careful math tutor."
SPECIALS = [chat.EOS, chat.IM_START, chat.IM_END]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=chat.IM_END, pad_token=chat.EOS, model_max_length=512
    )
    fast.chat_template = chat.CHATML_TEMPLATE
    return fast


def build_model(tokenizer, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(chat.IM_END),
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(cfg)


def _example(row: dict, rng: random.Random) -> list[dict]:
    system = SYSTEM_PROMPT if rng.random() < 0.5 else None
    return chat.prompt_messages(system, row["prompt"]) + [
        {"role": "assistant", "content": row["reference"]}
    ]


def pass_at_1(model, tokenizer, rows: list[dict], seed: int) -> float:
    prompts = [chat.render(chat.prompt_messages(SYSTEM_PROMPT, r["prompt"]), True) for r in rows]
    dec = sampling.Decoding(temperature=0.8, max_new_tokens=48)
    outs = sampling.generate(
        model, tokenizer, prompts, dec, k=1, seed=seed, batch_size=200, desc="pass@1"
    )
    return sum(verify.check(o[0]["text"], r["gold"])["strict"] for o, r in zip(outs, rows)) / len(
        rows
    )


def train(args) -> tuple[dict, dict]:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, args.seed)
    cats = {c: 1.0 for c in mathpool.CATEGORIES}
    train_rows = mathpool.generate(args.n_train, args.seed, "train", cats, "pretrain")
    eval_rows = mathpool.generate(200, args.seed + 1, "eval", cats, "pretrain-eval")
    rng = random.Random(args.seed)
    encoded = [chat.encode_with_mask(tokenizer, _example(r, rng)) for r in train_rows]

    def score(model, tokenizer, seed):
        return pass_at_1(model, tokenizer, eval_rows, seed)

    model, record = fit(model, tokenizer, encoded, rng, score, args)
    return {"model": model, "tokenizer": tokenizer}, record


def _step(model, opt, tokenizer, batch) -> float:
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), tokenizer.pad_token_id)
    labels = torch.full((len(batch), width), -100)
    for i, (x, m) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(x)] = torch.where(torch.tensor(m) == 1, torch.tensor(x), -100)
    model.train()
    loss = model(input_ids=ids, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def fit(model, tokenizer, encoded: list, rng: random.Random, score, args) -> tuple:
    """Pretrain on `encoded` (ids, loss mask) rows; every args.eval_every steps measure
    score(model, tokenizer, seed=step) and stop at the first checkpoint inside [min_pass,
    max_pass] (or past it: an error). Returns the model at that checkpoint and the record."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    history, chosen = [], None
    t0 = time.time()
    for step in range(1, args.max_steps + 1):
        loss = _step(model, opt, tokenizer, rng.sample(encoded, args.batch_size))
        if step % args.eval_every == 0:
            p1 = score(model, tokenizer, seed=step)
            history.append(
                {
                    "step": step,
                    "loss": round(loss, 4),
                    "pass_at_1": p1,
                    "elapsed_s": round(time.time() - t0, 1),
                }
            )
            print(json.dumps(history[-1]), file=sys.stderr, flush=True)
            if args.min_pass <= p1 <= args.max_pass:
                chosen = {"step": step, "pass_at_1": p1, "state": copy.deepcopy(model.state_dict())}
            if chosen is not None or p1 > args.max_pass:
                break  # the first checkpoint in the window is kept; nothing after it is
    if chosen is None:
        raise SystemExit(
            f"no checkpoint reached pass@1 in [{args.min_pass}, {args.max_pass}]: {history}"
        )
    model.load_state_dict(chosen.pop("state"))
    return model, {"chosen": chosen, "history": history}


def add_train_args(ap, out: str, n_train: int, lo: float, hi: float, batch: int = 64) -> None:
    ap.add_argument("--out", default=out, help="output model directory")
    ap.add_argument("--seed", type=int, default=0, help="init, data and sampling seed")
    ap.add_argument("--n-train", type=int, default=n_train, help="pretraining examples")
    ap.add_argument("--batch-size", type=int, default=batch, help="sequences per step")
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    ap.add_argument("--max-steps", type=int, default=4000, help="give up after this many steps")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between pass@1 checks")
    ap.add_argument("--min-pass", type=float, default=lo, help="lowest acceptable pass@1")
    ap.add_argument("--max-pass", type=float, default=hi, help="highest acceptable pass@1")


def save(out: Path, built: dict, record: dict, command: str, system_prompt: str, args) -> None:
    """The model directory with BUILD.json (command, chosen step, history, weights' sha256)."""
    with io.atomic_dir(out) as tmp:
        built["model"].save_pretrained(tmp)
        built["tokenizer"].save_pretrained(tmp)
        record.update(
            command=command,
            args=vars(args),
            system_prompt=system_prompt,
            weights_sha256=manifest.sha256_file(tmp / "model.safetensors"),
        )
        io.write_json(tmp / "BUILD.json", record)
    print(
        f"tiny model -> {out}: step {record['chosen']['step']}, pass@1 "
        f"{record['chosen']['pass_at_1']:.3f}, sha256 {record['weights_sha256']}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_train_args(ap, out="models/tiny-arith", n_train=20000, lo=0.30, hi=0.50)
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    built, record = train(args)
    command = "python -m arenaflow.bases.tinymodel " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    save(Path(args.out), built, record, command, SYSTEM_PROMPT, args)


if __name__ == "__main__":
    main()
