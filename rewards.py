"""Rewards: the paper's accuracy and parallel-format rewards, and the schedule that picks one per
training step (NOTES.md §4).

    text (with the tags) --extract_answer--> pred --verify(pred, gold)--> correct --+
    Structure (attention.parse_structure) --> has_parallel, format_ok ------------+--> reward

The answer checker (`extract_answer`, `verify`: normalisation, math-verify in worker processes,
deadlines) lives in verifier.py; this file holds what the paper defines.
"""
import sys
from dataclasses import dataclass

from attention import TagIds, parse_structure
from verifier import (
    STATED_RULES,
    check_verifier_settings,
    correct_many,
    extract_answer,
    extract_answer_by_rule,
    verify,
)

__all__ = ["FORMAT_FAILURES", "REWARDS", "SCHEDULES", "RewardSchedule", "answer_found",
           "check_format", "extract_answer", "format_failure", "has_parallel", "num_blocks",
           "parallel_positions", "score_batch", "verify"]

RIGHT = 1.0
WRONG = -1.0
RIGHT_AND_PARALLEL = 1.2       # the tiered reward's bonus for a correct answer with a block


# ---------------------------------------------------------------------------------------------
# The format (its rules: attention.parse_structure)


def structures_of(responses, tokenizer=None, tags=None) -> list:
    """parse_structure of each response, given as text (needs tokenizer) or as token ids (needs
    tags or tokenizer)."""
    if tags is None and tokenizer is None:
        raise ValueError("pass tags= (attention.TagIds) or tokenizer= so the tag ids are known")
    if any(isinstance(r, str) for r in responses):
        if tokenizer is None:
            raise ValueError("a response given as text needs tokenizer= to find its tags; or "
                             "pass its token ids")
        responses = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    tags = tags or TagIds.from_tokenizer(tokenizer)
    return [parse_structure(r, tags) for r in responses]


def check_format(response, tokenizer=None, tags=None) -> tuple[bool, str]:
    """(ok, reason) of a response's structure under `attention.parse_structure`'s rules; a text
    response needs `tokenizer`."""
    structure = structures_of([response], tokenizer, tags)[0]
    return structure.valid, structure.reason


def has_parallel(structure) -> bool:
    """At least one block, well-formed or not (the paper's "# Parallel")."""
    return len(structure.blocks) > 0


def num_blocks(structure) -> int:
    return len(structure.blocks)


def answer_found(text: str) -> bool:
    r"""Whether the response states a final answer: extract_answer found one by a marker rule
    (`Final Answer:`, `\boxed{}`, `####`: verifier.STATED_RULES), not by the last-number
    fallback. The structural check passes a response without tags (`mfmfmf`); this one does not.
    score_batch's "answer_found" is this, from the same extraction as its "pred"."""
    return extract_answer_by_rule(text)[1] in STATED_RULES


# Why a response fails the format, one name each (format_failure): the first problem
# attention.parse_structure found, by the words of its reason, else the missing answer
FORMAT_FAILURES = ("truncated", "unclosed_block", "no_summary", "too_few_paths", "empty_path",
                   "text_between_paths", "misplaced_tag", "no_answer")
REASON_WORDS = (("unclosed", "unclosed_block"), ("after the last </Parallel>", "unclosed_block"),
                ("no <Summary>", "no_summary"), ("needs >= 2", "too_few_paths"),
                ("empty path", "empty_path"), ("outside every path", "text_between_paths"))


def format_failure(structure, answer: bool, truncated: bool) -> str:
    """"" for a well-formed structure with a stated final answer (`answer_found`); else one name
    of FORMAT_FAILURES: "truncated" when the budget cut the response (finish_reason "budget")
    before its block closed or its answer came; a structural problem by its kind (a tag out of
    place: "misplaced_tag"); "no_answer" for a well-formed response that states none."""
    if structure.valid:
        if answer:
            return ""
        if truncated:
            return "truncated"
        return "no_answer"
    kind = "misplaced_tag"
    for words, name in REASON_WORDS:
        if words in structure.reason:
            kind = name
            break
    if kind == "unclosed_block" and truncated:
        return "truncated"
    return kind


def parallel_positions(structure) -> list[float]:
    """Each block's <Parallel> index / the response's length (Figure 3: blocks move later)."""
    if not structure.length:
        return []
    return [block.start / structure.length for block in structure.blocks]


# ---------------------------------------------------------------------------------------------
# The paper's rewards: (correct, has_parallel, format_ok) -> the reward of one response


def accuracy_reward(correct: bool, has_parallel: bool | None = None,
                    format_ok: bool | None = None) -> float:
    """S1, the evaluation, and S2's accuracy steps: +1 right, -1 wrong."""
    return RIGHT if correct else WRONG


def parallel_gated_reward(correct: bool, has_parallel: bool, format_ok: bool) -> float:
    """Seen's easy-RL stage: +1 only if right *and* with a well-formed block."""
    if correct and has_parallel and format_ok:
        return RIGHT
    return WRONG


def tiered_reward(correct: bool, has_parallel: bool, format_ok: bool) -> float:
    """S2's parallel steps: +1.2 right with a well-formed block, +1 right without a block, -1
    wrong, and -1 right with a malformed block."""
    if not correct:
        return WRONG
    if not has_parallel:
        return RIGHT
    if format_ok:
        return RIGHT_AND_PARALLEL
    return WRONG


REWARDS = {"accuracy": accuracy_reward, "parallel_gated": parallel_gated_reward,
           "tiered": tiered_reward}
SCHEDULES = ("accuracy", "parallel_gated", "tiered", "alternating", "scaffold")


@dataclass(frozen=True)
class RewardSchedule:
    """The reward of a (1-based) training step: "accuracy", "parallel_gated" or "tiered" at every
    step; "alternating" (Unseen S2): per window of `window` steps the first `accuracy_steps`
    accuracy, the rest tiered; "scaffold": alternating up to and including `switch_step`,
    accuracy after.
        >>> [RewardSchedule("scaffold", switch_step=20).kind_at(t) for t in (8, 9, 20, 21)]
        ['accuracy', 'tiered', 'tiered', 'accuracy']
        >>> RewardSchedule("alternating").reward(9, correct=True, has_parallel=True, format_ok=True)
        1.2
    """
    name: str = "accuracy"
    window: int = 10
    accuracy_steps: int = 8
    switch_step: int = 200

    def __post_init__(self):
        if self.name not in SCHEDULES:
            raise ValueError(f"reward schedule must be one of {SCHEDULES}, got {self.name!r}")
        if self.window < 1 or not 0 <= self.accuracy_steps <= self.window:
            raise ValueError(f"need 0 <= accuracy_steps <= window, got {self.accuracy_steps=}, "
                             f"{self.window=}")

    def kind_at(self, step: int) -> str:
        # >>> exercise 8: the S2 alternating reward schedule
        if step < 1:
            raise ValueError(f"training steps count from 1, got step={step}")
        if self.name in REWARDS:
            return self.name
        if self.name == "scaffold" and step > self.switch_step:
            return "accuracy"
        if (step - 1) % self.window < self.accuracy_steps:
            return "accuracy"
        return "tiered"
        # <<< exercise 8

    def reward(self, step: int, correct: bool, has_parallel: bool | None = None,
               format_ok: bool | None = None) -> float:
        # >>> exercise 8: the reward of one response at a step
        kind = self.kind_at(step)
        if kind != "accuracy" and (has_parallel is None or format_ok is None):
            raise ValueError(f"the {kind!r} reward (step {step}) needs has_parallel and format_ok")
        return REWARDS[kind](correct, has_parallel, format_ok)
        # <<< exercise 8


def score_batch(responses: list[str], golds: list[str], *, structures=None, response_ids=None,
                tags=None, tokenizer=None, reward: str | RewardSchedule = "accuracy",
                step: int = 1, verifier: str = "default", timeout: float = 1.0,
                workers: int | None = None) -> list[dict]:
    """Score one step's responses (texts with the tags): per response {"reward", "correct",
    "pred", "answer_found", "kind", "has_parallel", "format_ok", "num_blocks"}; format_ok is the
    paper's structural check (a response without tags passes it). The structure: `structures` (the
    sampler's), else `response_ids` with `tags` or `tokenizer`, else the texts encoded by
    `tokenizer`, else None (only "accuracy" allows that). `verifier`, `timeout`, `workers`: the
    answer checker's (verifier.verify)."""
    n = len(responses)
    if len(golds) != n:
        raise ValueError(f"score_batch got {n} responses but {len(golds)} golds")
    schedule = reward if isinstance(reward, RewardSchedule) else RewardSchedule(reward)
    kind = schedule.kind_at(step)
    check_verifier_settings(verifier, timeout)
    if structures is None and (response_ids is not None or tokenizer is not None):
        given = response_ids if response_ids is not None else list(responses)
        structures = structures_of(given, tokenizer, tags)
    if structures is not None and len(structures) != n:
        raise ValueError(f"score_batch got {n} responses but {len(structures)} "
                         "structures/response_ids")
    if structures is None and kind != "accuracy":
        raise ValueError(f"the {kind!r} reward needs the structure: structures=, response_ids= "
                         "with tags=, or tokenizer=")
    extracted = [extract_answer_by_rule(r) for r in responses]      # (pred, rule) each
    preds = [pred for pred, _ in extracted]
    correct = correct_many(preds, golds, verifier, timeout, workers)
    scores = []
    for i in range(n):
        structure = structures[i] if structures is not None else None
        parallel = has_parallel(structure) if structure is not None else None
        format_ok = structure.valid if structure is not None else None
        blocks = num_blocks(structure) if structure is not None else None
        scores.append({"reward": REWARDS[kind](correct[i], parallel, format_ok),
                       "correct": correct[i], "pred": preds[i], "kind": kind,
                       "answer_found": extracted[i][1] in STATED_RULES,
                       "has_parallel": parallel, "format_ok": format_ok, "num_blocks": blocks})
    return scores


if __name__ == "__main__":         # python rewards.py RESPONSE_OR_ANSWER GOLD: do they match?
    if len(sys.argv) != 3:
        sys.exit("usage: python rewards.py RESPONSE_OR_ANSWER GOLD    # prints whether they match")
    print(verify(extract_answer(sys.argv[1]) or sys.argv[1], sys.argv[2]))
