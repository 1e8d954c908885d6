"""Throughput of rewards.score_batch on a realistic mixed batch: python scripts/bench_rewards.py [--n=2048 --workers=0]

A batch like one GRPO step's: responses in the canonical layout (60% with a block) whose answers are plain,
LaTeX, symbolic, set, interval or percent forms, right or wrong, ~10% adversarial (code, huge powers, brace
bombs); scored once with a cold pool (it starts the workers), once warm with fresh answers.
"""
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Literal

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the core modules

import config  # noqa: E402
from attention import TagIds  # noqa: E402
from model import load_model  # noqa: E402
from rewards import default_workers, pool_stats, score_batch  # noqa: E402


@dataclass
class BenchConfig:
    """python scripts/bench_rewards.py: the throughput of score_batch."""
    n: int = 2048              # items in the batch (GRPO: prompts x group_size)
    group_size: int = 8        # responses per prompt (they share a gold)
    workers: int = 0           # symbolic workers; 0 = default_workers()
    timeout: float = 1.0       # per symbolic check, seconds
    reward: Literal["accuracy", "parallel_gated", "tiered", "alternating", "scaffold"] = "tiered"
    seed: int = 0


def _bench_batch(cfg: BenchConfig):
    """Responses in the canonical layout with golds of mixed kinds, ~10% adversarial."""
    rng = random.Random(cfg.seed)
    kinds = [  # (gold, correct forms that need numbers/LaTeX/symbolic, wrong forms)
        lambda k: (str(k), [str(k), f"{k}.0", f"\\boxed{{{k}}}", f"{k} apples"], [str(k + 1), str(k * 2)]),
        lambda k: (f"\\frac{{{k}}}{{{k + 1}}}", [f"\\dfrac{{{k}}}{{{k + 1}}}", f"{k}/{k + 1}"],
                   [f"\\frac{{{k + 1}}}{{{k}}}"]),
        lambda k: (f"{k}\\sqrt{{2}}", [f"\\sqrt{{{2 * k * k}}}", f"{k}\\sqrt2"], [f"{k}\\sqrt{{3}}", f"\\sqrt{{{k}}}"]),
        lambda k: (f"\\{{1,{k},{k + 2}\\}}", [f"\\{{{k + 2},1,{k}\\}}"], [f"\\{{1,{k}\\}}"]),
        lambda k: (f"[{k}, {k + 3})", [f"[{k},{k + 3})", f"\\left[{k}, {k + 3}\\right)"], [f"({k},{k + 3})"]),
        lambda k: (f"{k}x^2+{2 * k}x", [f"{k}x(x+2)", f"{k}x^2+{2 * k}x"], [f"{k}x^2+{k}x"]),
        lambda k: (f"{k * 10}\\%", [f"{k * 10}", f"{k * 10}\\%"], [f"{k}"]),
    ]
    weights = [10, 2, 1, 1, 1, 1, 1]
    adversarial = ["__import__('os').system('echo pwned')", "().__class__.__bases__[0].__subclasses__()",
                   "9**9**9**9**9", "10^{10^{10^{10}}}", "{" * 10000, "\\frac{1}{" * 400 + "2" + "}" * 400,
                   "1" * 5000, "2^{999999}"]
    responses, gold_list = [], []
    while len(responses) < cfg.n:
        gold, right, wrong = rng.choices(kinds, weights)[0](rng.randint(2, 99))
        for _ in range(cfg.group_size):
            u = rng.random()
            ans = (rng.choice(adversarial) if u < 0.1 else rng.choice(right) if u < 0.6 else
                   rng.choice(wrong) if u < 0.9 else None)
            body = "Let me think." + (" step" * rng.randint(20, 120))
            if rng.random() < 0.6:
                body += ("<Parallel><Path> one way </Path><Path> another way </Path></Parallel>\n"
                         "<Summary> both agree </Summary>")
            responses.append(body + (f"\nFinal Answer: {ans}" if ans is not None else " I am not sure."))
            gold_list.append(gold)
    return responses[:cfg.n], gold_list[:cfg.n]


def bench(cfg: BenchConfig) -> None:
    _, tok = load_model("tiny")
    tags = TagIds.from_tokenizer(tok)
    responses, golds = _bench_batch(cfg)
    ids = tok(responses, add_special_tokens=False)["input_ids"]
    workers = cfg.workers or default_workers()
    print(f"batch: {len(responses)} responses, {len(set(golds))} distinct golds, {workers} symbolic workers, "
          f"timeout {cfg.timeout} s, {os.cpu_count()} CPUs")
    for label in ("cold (starts the pool)", "warm (a new batch)"):
        if label.startswith("warm"):                  # fresh answers: no cache of the first run helps
            responses, golds = _bench_batch(BenchConfig(**{**vars(cfg), "seed": cfg.seed + 1}))
            ids = tok(responses, add_special_tokens=False)["input_ids"]
        t0 = time.perf_counter()
        scores = score_batch(responses, golds, response_ids=ids, tags=tags, reward=cfg.reward, step=9,
                             timeout=cfg.timeout, workers=workers)
        dt = time.perf_counter() - t0
        acc = sum(s["correct"] for s in scores) / len(scores)
        print(f"{label:>24}: {dt:6.2f} s  {len(scores) / dt:8.0f} items/s   accuracy {acc:.3f}  "
              f"mean reward {sum(s['reward'] for s in scores) / len(scores):+.3f}  pool {pool_stats()}")


if __name__ == "__main__":
    bench(config.parse(BenchConfig, sys.argv[1:]))
