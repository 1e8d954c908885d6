"""A golden run: a fingerprint of short training and evaluation runs, to check that a refactor
changes nothing.

    OMP_NUM_THREADS=1 python scripts/bench/golden_run.py --out=/tmp/golden-before.json
    ... refactor ...
    OMP_NUM_THREADS=1 python scripts/bench/golden_run.py --out=/tmp/golden-after.json \\
        --compare=/tmp/golden-before.json

What runs (fixed seeds, about 5 minutes on one thread): a 150-step Unseen SFT, a 100-step Seen SFT,
3 GRPO steps of unseen-s2 with the KL term and evaluations, 3 steps of recipe seen (its easy stage
included), and an eval.py run. The fingerprint holds a SHA-256 of every checkpoint's weights, every
logged value except timings, and the evaluation's summary. `--compare` prints each difference and
exits 1 if there is one.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
TIMING_WORDS = ("time", "elapsed", "tokens_per_s", "seconds")
OUTPUT_TAIL = 3000          # characters of a failed run's stdout and stderr shown
SHOWN_DIFFERENCES = 50      # differences printed by --compare (all are counted)


def run(args: list[str]) -> None:
    """Run one of the project's scripts with the current Python, one thread, offline; stop on
    failure."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    print("$ python " + " ".join(args), flush=True)
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"golden_run: {' '.join(args)} failed:\n{done.stdout[-OUTPUT_TAIL:]}\n"
                 f"{done.stderr[-OUTPUT_TAIL:]}")


def weights_digest(checkpoint: str) -> str:
    """SHA-256 over the checkpoint's tensors, by name (the file's metadata may differ)."""
    import torch
    from safetensors.torch import load_file
    tensors = load_file(os.path.join(checkpoint, "model.safetensors"))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        raw_bytes = tensors[name].contiguous().view(-1).view(dtype=torch.uint8)
        digest.update(raw_bytes.numpy())
    return digest.hexdigest()


def log_rows(run_dir: str) -> list[dict]:
    """log.jsonl's rows without the fields that measure time."""
    rows = []
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            rows.append({k: v for k, v in row.items() if not any(w in k for w in TIMING_WORDS)})
    return rows


def fingerprint(work: str) -> dict:
    sft_unseen = os.path.join(work, "sft_unseen")
    sft_seen = os.path.join(work, "sft_seen")
    grpo_unseen = os.path.join(work, "grpo_unseen")
    grpo_seen = os.path.join(work, "grpo_seen")
    evaluation = os.path.join(work, "eval")
    short_grpo = ["--max_steps=3", "--batch_size=8", "--group_size=4", "--eval_every=2",
                  "--eval_samples=4", "--eval_k=2", "--save_every=0", "--log_every=1"]
    run(["sft.py", "--max_steps=150", "--eval_samples=4", f"--out_dir={sft_unseen}"])
    run(["sft.py", "--mode=seen", "--max_steps=100", "--eval_samples=4", "--seed=1",
         f"--out_dir={sft_seen}"])
    run(["grpo.py", "--recipe=unseen-s2", f"--model={sft_unseen}/checkpoint-150",
         f"--out_dir={grpo_unseen}", "--micro_batch_size=5", *short_grpo])
    run(["grpo.py", "--recipe=seen", f"--model={sft_seen}/checkpoint-100", f"--out_dir={grpo_seen}",
         "--easy_steps=1", "--kl_coef=0", "--loss_agg_mode=seq-mean-token-mean", *short_grpo])
    run(["eval.py", f"--model={grpo_unseen}/checkpoint-3", "--limit=4", "--k=2",
         f"--out_dir={evaluation}"])
    out = {"weights": {}, "logs": {}}
    checkpoints = {"sft_unseen": f"{sft_unseen}/checkpoint-150",
                   "sft_seen": f"{sft_seen}/checkpoint-100",
                   "grpo_unseen": f"{grpo_unseen}/checkpoint-3",
                   "grpo_seen": f"{grpo_seen}/checkpoint-3"}
    for name, path in checkpoints.items():
        out["weights"][name] = weights_digest(path)
        out["logs"][name] = log_rows(os.path.dirname(path))
    with open(os.path.join(evaluation, "summary.json")) as f:
        summary = json.load(f)
    out["eval"] = {"benchmarks": summary["benchmarks"], "avg_mean_at_k": summary["avg_mean_at_k"]}
    with open(os.path.join(evaluation, "samples.jsonl")) as f:
        out["eval_samples"] = [json.loads(line)["response"] for line in f]
    return out


def differences(a, b, where: str = "") -> list[str]:
    """Every path at which two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b)):
            found += differences(a.get(key), b.get(key), f"{where}/{key}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        found = []
        for i, (x, y) in enumerate(zip(a, b)):
            found += differences(x, y, f"{where}[{i}]")
        return found
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where to write the fingerprint (JSON)")
    parser.add_argument("--compare", default="", help="an earlier fingerprint to compare with")
    parser.add_argument("--work", default="", help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="golden-")
    result = fingerprint(work)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"golden_run: wrote {args.out} (runs in {work})")
    if args.compare:
        with open(args.compare) as f:
            found = differences(json.load(f), result)
        for line in found[:SHOWN_DIFFERENCES]:
            print(line)
        print(f"golden_run: {len(found)} difference(s) against {args.compare}")
        sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
