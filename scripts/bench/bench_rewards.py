"""Throughput of rewards.score_batch on a realistic mixed batch:

    python scripts/bench/bench_rewards.py [--n=2048 --workers=0]

A batch like one GRPO step's: responses in the canonical layout (60% with a block) whose answers
are plain, LaTeX, symbolic, set, interval or percent forms, right or wrong, ~10% adversarial (code,
huge powers, brace bombs), on a Final Answer line (75%), in a \\boxed{} (15%) or at the end of a
sentence (10%); scored once with a cold pool (it starts the workers), then `rounds` times warm with
fresh answers.

    python scripts/bench/bench_rewards.py --compare=HEAD~1   # also HEAD~1's rewards.py, same
                                                             # batches

--compare loads the other rewards.py from `git show REV:rewards.py` as a second module with its own
workers and scores each batch with both, in alternating order, so both run under the same load; the
last lines are the median warm throughput of each and the ratio this tree / REV (of the medians, and
per round).
"""
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import config
import rewards
import verifier
from attention import TagIds
from model import load_model

# The answer of a response: an adversarial string below ADVERSARIAL, a right form below RIGHT, a
# wrong form below WRONG (of a uniform draw), else none at all.
ADVERSARIAL = 0.1
RIGHT = 0.6
WRONG = 0.9
BLOCK_SHARE = 0.6                     # responses with a <Parallel> block
ANSWER_FORMS = {"\nFinal Answer: {}": 75,               # form -> weight
                "\nso the answer is \\boxed{{{}}}": 15,
                "\nSo it is {}.": 10}
FILLER_STEPS = (20, 120)              # " step" words before the answer (uniform, inclusive)
GOLD_RANGE = (2, 99)                  # the number each gold is built from
SCORED_STEP = 9       # the step scored: "alternating" and "scaffold" give the tiered reward there


@dataclass
class BenchConfig:
    """python scripts/bench/bench_rewards.py: the throughput of score_batch."""
    n: int = 2048              # items in the batch (GRPO: prompts x group_size)
    group_size: int = 8        # responses per prompt (they share a gold)
    workers: int = 0           # symbolic workers; 0 = default_workers()
    timeout: float = 1.0       # per symbolic check, seconds
    reward: Literal["accuracy", "parallel_gated", "tiered", "alternating", "scaffold"] = "tiered"
    seed: int = 0
    rounds: int = 3            # warm batches after the cold one
    compare: str = ""          # a git revision: its rewards.py scores the same batches too


def _bench_batch(cfg: BenchConfig):
    """Responses in the canonical layout with golds of mixed kinds, ~10% adversarial."""
    rng = random.Random(cfg.seed)
    kinds = [  # (gold, correct forms that need numbers/LaTeX/symbolic, wrong forms)
        lambda k: (str(k), [str(k), f"{k}.0", f"\\boxed{{{k}}}", f"{k} apples"],
                   [str(k + 1), str(k * 2)]),
        lambda k: (f"\\frac{{{k}}}{{{k + 1}}}", [f"\\dfrac{{{k}}}{{{k + 1}}}", f"{k}/{k + 1}"],
                   [f"\\frac{{{k + 1}}}{{{k}}}"]),
        lambda k: (f"{k}\\sqrt{{2}}", [f"\\sqrt{{{2 * k * k}}}", f"{k}\\sqrt2"],
                   [f"{k}\\sqrt{{3}}", f"\\sqrt{{{k}}}"]),
        lambda k: (f"\\{{1,{k},{k + 2}\\}}", [f"\\{{{k + 2},1,{k}\\}}"], [f"\\{{1,{k}\\}}"]),
        lambda k: (f"[{k}, {k + 3})", [f"[{k},{k + 3})", f"\\left[{k}, {k + 3}\\right)"],
                   [f"({k},{k + 3})"]),
        lambda k: (f"{k}x^2+{2 * k}x", [f"{k}x(x+2)", f"{k}x^2+{2 * k}x"], [f"{k}x^2+{k}x"]),
        lambda k: (f"{k * 10}\\%", [f"{k * 10}", f"{k * 10}\\%"], [f"{k}"]),
    ]
    weights = [10, 2, 1, 1, 1, 1, 1]
    adversarial = ["__import__('os').system('echo pwned')",
                   "().__class__.__bases__[0].__subclasses__()",
                   "9**9**9**9**9", "10^{10^{10^{10}}}", "{" * 10000,
                   "\\frac{1}{" * 400 + "2" + "}" * 400, "1" * 5000, "2^{999999}"]
    responses = []
    gold_list = []
    while len(responses) < cfg.n:
        make_gold = rng.choices(kinds, weights)[0]
        gold, right, wrong = make_gold(rng.randint(*GOLD_RANGE))
        for _ in range(cfg.group_size):
            u = rng.random()
            if u < ADVERSARIAL:
                ans = rng.choice(adversarial)
            elif u < RIGHT:
                ans = rng.choice(right)
            elif u < WRONG:
                ans = rng.choice(wrong)
            else:
                ans = None
            body = "Let me think." + (" step" * rng.randint(*FILLER_STEPS))
            if rng.random() < BLOCK_SHARE:
                body += ("<Parallel><Path> one way </Path><Path> another way </Path></Parallel>\n"
                         "<Summary> both agree </Summary>")
            form = rng.choices(list(ANSWER_FORMS), list(ANSWER_FORMS.values()))[0]
            if ans is None:
                responses.append(body + " I am not sure.")
            else:
                responses.append(body + form.format(ans))
            gold_list.append(gold)
    return responses[:cfg.n], gold_list[:cfg.n]


def _rewards_at(rev: str):
    """rewards.py of git revision `rev`, imported from a temporary copy as a separate module."""
    source = subprocess.run(["git", "show", f"{rev}:rewards.py"], cwd=ROOT, check=True,
                            capture_output=True).stdout
    path = os.path.join(tempfile.mkdtemp(prefix="bench_rewards_"), "rewards_at_rev.py")
    with open(path, "wb") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("rewards_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench(cfg: BenchConfig) -> None:
    _, tok = load_model("tiny")
    tags = TagIds.from_tokenizer(tok)
    modules = {"this tree": rewards}
    if cfg.compare:
        modules[cfg.compare] = _rewards_at(cfg.compare)
    workers = cfg.workers or verifier.default_workers()
    print(f"{cfg.n} responses per batch, {workers} symbolic workers, timeout {cfg.timeout} s, "
          f"{os.cpu_count()} CPUs")
    rates = {name: [] for name in modules}
    for r in range(cfg.rounds + 1):              # round 0 starts the pools; each round a new batch
        responses, golds = _bench_batch(BenchConfig(**{**vars(cfg), "seed": cfg.seed + r}))
        ids = tok(responses, add_special_tokens=False)["input_ids"]
        names = list(modules) if r % 2 == 0 else list(modules)[::-1]
        label = "cold" if r == 0 else f"warm {r}"
        for name in names:
            # a --compare revision older than verifier.py has pool_stats in its rewards.py
            pool_stats = getattr(modules[name], "pool_stats", verifier.pool_stats)
            t0 = time.perf_counter()
            scores = modules[name].score_batch(responses, golds, response_ids=ids, tags=tags,
                                               reward=cfg.reward, step=SCORED_STEP,
                                               timeout=cfg.timeout, workers=workers)
            dt = time.perf_counter() - t0
            if r:
                rates[name].append(len(scores) / dt)
            acc = sum(s["correct"] for s in scores) / len(scores)
            mean_reward = sum(s["reward"] for s in scores) / len(scores)
            print(f"{label:>7} {name:>12}: {dt:6.2f} s {len(scores) / dt:8.0f} items/s  "
                  f"accuracy {acc:.3f}  mean reward {mean_reward:+.3f}  "
                  f"pool {pool_stats()}")
    medians = {name: statistics.median(v) for name, v in rates.items() if v}
    print("median warm items/s: " + ", ".join(f"{k} {v:.0f}" for k, v in medians.items()))
    if cfg.compare:                # each round's two runs share a batch and the machine's load then
        per_round = [a / b for a, b in zip(rates["this tree"], rates[cfg.compare])]
        ratio = medians["this tree"] / medians[cfg.compare]
        print(f"this tree / {cfg.compare}: {ratio:.2f} (medians), per round median "
              f"{statistics.median(per_round):.2f}, "
              f"range {min(per_round):.2f}-{max(per_round):.2f}")


if __name__ == "__main__":
    bench(config.parse(BenchConfig, sys.argv[1:]))
