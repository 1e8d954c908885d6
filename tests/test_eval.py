"""eval.py: Pass@k / Mean@k arithmetic, the Table 2 layout, evaluate() against the sampler, the CLI,
plots."""
import json
import math
import os
import re
import types

import pytest
import torch

import config
import eval as ev
import sft
from attention import TagIds, parse_structure
from data import ANSWER_FIELDS, PROBLEM_FIELDS, SOLUTION_FIELDS, build_prompt, load_data
from model import build_char_tokenizer, load_model, mode_from_config, read_checkpoint_config
from plumbing import save_checkpoint
from rewards import FORMAT_FAILURES, answer_found, extract_answer, score_batch, verify
from sample import generate

# --------------------------------------------------------------------------------------------------
# Pass@k


def test_pass_at_k_hand_values():
    assert ev.pass_at_k(16, 1, 16) == 1.0          # the one correct sample is always among the 16
    assert ev.pass_at_k(16, 1, 1) == pytest.approx(1 / 16, abs=1e-15)
    assert ev.pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)   # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert ev.pass_at_k(16, 0, 16) == 0.0
    assert ev.pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-15)   # 1 - C(3,2)/C(4,2) = 1 - 3/6
    # C(7,3)=35, C(10,3)=120
    assert ev.pass_at_k(10, 3, 3) == pytest.approx(1 - 35 / 120, abs=1e-15)
    # C(999,500)/C(1000,500) = 1/2
    assert ev.pass_at_k(1000, 1, 500) == pytest.approx(0.5, abs=1e-12)
    # verl's bootstrap expectation is biased low: one correct of 16 -> 1 - (15/16)^16
    assert ev.pass_at_k_verl(16, 1, 16) == pytest.approx(1 - (15 / 16) ** 16, abs=1e-15)
    assert 0.643 < ev.pass_at_k_verl(16, 1, 16) < 0.645


def test_pass_at_k_equals_binomial_formula():
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert ev.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


# --------------------------------------------------------------------------------------------------
# Mean@k, Pass@k and the structure statistics over hand-made samples


def _sample(pid, correct, blocks=(), valid=True, T=10, D=10, bench="b", answer=True):
    return {"benchmark": bench, "id": pid, "correct": correct, "has_parallel": bool(blocks),
            "num_blocks": len(blocks), "parallel_positions": list(blocks), "structure_ok": valid,
            "answer_found": answer, "T": T, "D": D}


def test_summarize_hand_computed():
    samples = [_sample("A", True, [0.1], T=20, D=14), _sample("A", False), _sample("A", False),
               _sample("A", False, [0.2, 0.6], valid=False, T=30, D=22),
               _sample("B", True), _sample("B", True, [0.4]), _sample("B", False, answer=False),
               _sample("B", True)]
    m = ev.summarize(samples, k=4)
    assert m["mean_at_k"] == pytest.approx((1 / 4 + 3 / 4) / 2)            # 0.5
    assert m["pass_at_k"] == 1.0                                        # both problems have a hit
    # A: 1-C(3,2)/C(4,2)
    assert ev.summarize(samples, k=2)["pass_at_k"] == pytest.approx((0.5 + 1.0) / 2)
    assert ev.summarize(samples, k=1)["pass_at_k"] == pytest.approx(0.5)   # Pass@1 = Mean
    assert m["pass_at_k_verl"] == pytest.approx(((1 - 0.75 ** 4) + (1 - 0.25 ** 4)) / 2)
    assert m["parallel_ratio"] == 3 / 8
    assert m["mean_blocks"] == 4 / 8
    # every block once
    assert m["mean_parallel_position"] == pytest.approx((0.1 + 0.2 + 0.6 + 0.4) / 4)
    assert m["mean_T"] == (20 + 30 + 6 * 10) / 8 and m["mean_D"] == (14 + 22 + 6 * 10) / 8
    assert m["structure_ok"] == 7 / 8 and m["blocks_well_formed"] == pytest.approx(2 / 3)
    assert m["answer_found"] == 7 / 8
    assert (m["k"], m["num_problems"], m["num_responses"]) == (4, 2, 8)
    # the same id in two benchmarks is two problems; a problem with fewer than k samples is an error
    two = ev.summarize([_sample("A", True, bench="x"), _sample("A", False, bench="y")], k=1)
    assert (two["num_problems"], two["pass_at_k"]) == (2, 0.5)
    with pytest.raises(ValueError, match="fewer than k"):
        ev.summarize(samples, k=5)
    none = ev.summarize([_sample("A", False)], k=1)
    assert none["mean_parallel_position"] is None and none["blocks_well_formed"] is None


def test_rollout_stats_do_not_read_garbage_as_well_formed():
    """A step of garbage (`mfmfmf`: no tag, no answer) reads structure_ok 1.0 (the paper's check
    passes a response without tags) but answer_found 0 and every response under
    fail/no_answer; a block cut by the budget is "truncated"; blocks_well_formed counts only the
    responses with blocks. The printed line names the failures by reason."""
    tok = load_model("tiny")[1]
    tags = TagIds.from_tokenizer(tok)
    texts = ["mfmfmfmf", "mfmf", "x<Parallel><Path>a</Path><Path>b", "Final Answer: 3"]
    finish = ["eos", "eos", "budget", "eos"]
    structures = [parse_structure(tok.encode(t, add_special_tokens=False), tags) for t in texts]
    rollouts = [types.SimpleNamespace(structure=s, num_tokens=8, critical_path=6, finish_reason=f)
                for s, f in zip(structures, finish)]
    scores = score_batch(texts, ["3"] * 4, structures=structures)
    stats = ev.rollout_stats(rollouts, scores, torch.tensor([True, False]), "cpu")
    assert (stats["structure_ok"], stats["answer_found"]) == (3 / 4, 1 / 4)
    assert (stats["parallel_ratio"], stats["blocks_well_formed"]) == (1 / 4, 0.0)
    assert stats["fail/no_answer"] == 2 / 4 and stats["fail/truncated"] == 1 / 4
    assert sum(stats[f"fail/{name}"] for name in FORMAT_FAILURES) == 3 / 4
    row = {**stats, **{k: 0.0 for k in ev.LOG_KEYS if k not in stats}}
    line = ev.log_line(5, row)
    assert line.startswith("step 5: reward_mean ")
    assert "structure_ok 0.750 answer_found 0.250" in line
    assert line.endswith("| format failures: truncated 0.250 no_answer 0.500")
    no_blocks = ev.rollout_stats(rollouts[:2], scores[:2], torch.tensor([False]), "cpu")
    assert no_blocks["blocks_well_formed"] is None and no_blocks["structure_ok"] == 1.0


def test_a_file_with_other_field_names_names_them_and_the_accepted_ones(tmp_path):
    """eval.py --data=file.jsonl whose rows say "q" and "sol" said only "gave no records"; now the
    error names the fields it read and the ones it accepts."""
    f = tmp_path / "mine.jsonl"
    f.write_text('{"q": "What is 1+1?", "sol": "2"}\n{"q": "What is 2+2?", "sol": "4"}\n')
    cfg = config.parse(ev.EvalConfig, ["--model=tiny", f"--data={f}", "--k=1",
                                       f"--out_dir={tmp_path / 'out'}"])
    with pytest.raises(ValueError) as e:
        ev.run(cfg)
    message = str(e.value)
    assert f"{f}: none of its 2 rows has both a problem and an answer" in message
    assert "its fields are ['q', 'sol']" in message
    for accepted in (*PROBLEM_FIELDS, *ANSWER_FIELDS, *SOLUTION_FIELDS):
        assert repr(accepted) in message


def test_avg_is_the_mean_of_the_mean_at_columns():
    # Table 2, GRPO (DAPO): (14.8 + 18.5 + 63.6 + 83.5) / 4 = 45.1, unweighted by benchmark size
    benches = {"aime25": {"mean_at_k": 0.148, "num_responses": 480},
               "aime24": {"mean_at_k": 0.185, "num_responses": 480},
               "amc23": {"mean_at_k": 0.636, "num_responses": 640},
               "math500": {"mean_at_k": 0.835, "num_responses": 316}}
    assert ev.average_mean_at_k(benches) == pytest.approx(0.451)


# --------------------------------------------------------------------------------------------------
# The table


def _m(k, mean, pss, ratio, n):
    return {"k": k, "mean_at_k": mean, "pass_at_k": pss, "parallel_ratio": ratio,
            "num_responses": n}


def test_format_table_layout_reproduces_table2_rows():
    rows = {
        "GRPO (DAPO)": {"aime25": _m(16, .148, .324, 0, 480), "aime24": _m(16, .185, .306, 0, 480),
                        "amc23": _m(16, .636, .851, 0, 640), "math500": _m(1, .835, .835, 0, 316)},
        "Parallel-R1-Unseen (S1)": {"aime25": _m(16, .177, .378, .136, 480),
                                    "aime24": _m(16, .183, .332, .136, 480),
                                    "amc23": _m(16, .697, .889, .136, 640),
                                    "math500": _m(1, .826, .826, .136, 316)},
        # pooled Parallel %: (0.5*100 + 0*300) / 400 = 12.5 (not the unweighted 25.0); a missing
        # bench is "-"
        "partial": {"aime25": _m(16, .2, .5, .5, 100), "math500": _m(1, .5, .5, 0.0, 300)},
    }
    assert ev.format_table(rows) == (
        "| Method | Parallel % | AIME25 Mean@16 | AIME25 Pass@16 | AIME24 Mean@16 | AIME24 Pass@16 "
        "| AMC23 Mean@16 | AMC23 Pass@16 | MATH Mean@1 | Avg |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        "| GRPO (DAPO) | 0.0 | 14.8 | 32.4 | 18.5 | 30.6 | 63.6 | 85.1 | 83.5 | 45.1 |\n"
        "| Parallel-R1-Unseen (S1) | 13.6 | 17.7 | 37.8 | 18.3 | 33.2 | 69.7 | 88.9 | 82.6 "
        "| 47.1 |\n"
        "| partial | 12.5 | 20.0 | 50.0 | - | - | - | - | 50.0 | 35.0 |")
    with pytest.raises(ValueError, match="k=8"):
        ev.format_table({"a": {"aime25": _m(16, 0, 0, 0, 1)}, "b": {"aime25": _m(8, 0, 0, 0, 1)}})


# --------------------------------------------------------------------------------------------------
# evaluate() on a tiny random model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model gains nothing from intra-op threads, and on a shared 2-core machine their
    spin-waits made these tests ~7x slower; restored afterwards for the other test files."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


@pytest.fixture(scope="module")
def records():
    return load_data("synthetic:hard:test", limit=2)


@pytest.mark.parametrize("mode,batch_size", [("unseen", 2), ("sequential", 1)])
def test_evaluate_is_the_sampler_scored_and_deterministic(tiny, records, mode, batch_size):
    model, tok = tiny
    model.train()
    kw = dict(k=2, max_new_tokens=16, seed=3, batch_size=batch_size, prompt_style="bare")
    metrics, samples = ev.evaluate(model, tok, records, mode, **kw)
    assert model.training                                # the caller's train/eval state is restored
    model.eval()
    # what evaluate sampled is exactly sample.generate on the built prompts, batch b seeded with
    # seed + b
    prompts = [build_prompt(tok, r["problem"], "bare") for r in records]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    # (sequential mode bans <Parallel>, as the sequential rollouts do)
    gen = dict(group_size=2, mode=mode, max_new_tokens=16, allow_parallel=mode != "sequential")
    ref = (generate(model, tok, ids, seed=3, **gen) if batch_size == 2 else
           [r for b in range(2) for r in generate(model, tok, ids[b:b + 1], seed=3 + b, **gen)])
    assert len(samples) == 4
    for i, (s, r) in enumerate(zip(samples, ref)):
        rec = records[i // 2]
        assert (s["id"], s["gold"], s["prompt"], s["sample_index"]) == \
            (rec["id"], rec["answer"], prompts[i // 2], i % 2)
        assert (s["response"], s["T"], s["D"], s["finish_reason"]) == \
            (r.text, r.num_tokens, r.critical_path, r.finish_reason)
        assert s["extracted_answer"] == extract_answer(r.text)
        assert s["correct"] == verify(extract_answer(r.text), rec["answer"])
        assert s["reward"] == (1.0 if s["correct"] else -1.0)
        assert (s["num_blocks"], s["structure_ok"]) == (len(r.structure.blocks), r.structure.valid)
        assert s["answer_found"] == answer_found(r.text)
    assert metrics == ev.summarize(samples, 2)
    for key in ("mean_at_k", "pass_at_k", "parallel_ratio", "structure_ok", "answer_found"):
        assert 0.0 <= metrics[key] <= 1.0
    assert metrics["mean_at_k"] <= metrics["pass_at_k"]
    assert 0 < metrics["mean_D"] <= metrics["mean_T"] <= 16 and metrics["mean_blocks"] >= 0
    pos = metrics["mean_parallel_position"]
    assert pos is None if metrics["parallel_ratio"] == 0 else 0.0 <= pos < 1.0
    again = ev.evaluate(model, tok, records, mode, **kw)
    assert again == (metrics, samples)


def test_evaluate_seeds_each_problem_by_its_place(tiny, records):
    """With `places` (GRPO's held-out evaluation: each problem's place in the whole list), every
    problem's responses are those of one generate call seeded by the places, in batches of 1 as
    in 1 batch (batch b no longer adds b to the seed)."""
    model, tok = tiny
    ids = [tok(build_prompt(tok, r["problem"], "bare"), add_special_tokens=False)["input_ids"]
           for r in records]
    ref = generate(model, tok, ids, group_size=2, mode="unseen", max_new_tokens=16, seed=3,
                   places=[5, 2])
    for batch_size in (1, 2):
        samples = ev.evaluate(model, tok, records, "unseen", k=2, max_new_tokens=16, seed=3,
                              batch_size=batch_size, prompt_style="bare", places=[5, 2])[1]
        assert [s["response"] for s in samples] == [r.text for r in ref]


def test_evaluate_rejects_bad_arguments(tiny, records):
    model, tok = tiny
    with pytest.raises(ValueError, match="k and batch_size"):
        ev.evaluate(model, tok, records, "unseen", k=0)
    with pytest.raises(ValueError, match="places: 1 for 2 records; give one a record"):
        ev.evaluate(model, tok, records, "unseen", places=[0])


# --------------------------------------------------------------------------------------------------
# The command line: checkpoint mode, tags, outputs, errors


def test_checkpoint_mode_and_tag_check(tmp_path, tiny):
    model, tok = tiny
    ckpt = tmp_path / "seen"
    save_checkpoint(str(ckpt), model, tok,
                    trainer_state={"step": 3, "config": {"mode": "seen", "style": "parallel"}})
    cfg, where = read_checkpoint_config(str(ckpt))
    assert (mode_from_config(cfg), os.path.basename(where)) == ("seen", "trainer_state.pt")
    assert ev.check_tags(ev.own_tokenizer(str(ckpt)), str(ckpt), "unseen") is True
    assert mode_from_config({"mode": "unseen", "style": "sequential"}) == "sequential"
    assert mode_from_config({}) is None and read_checkpoint_config("tiny") == ({}, "")
    # preferred when present
    (ckpt / "parallel_r1.json").write_text(json.dumps({"mode": "sequential"}))
    assert mode_from_config(read_checkpoint_config(str(ckpt))[0]) == "sequential"

    bare = tmp_path / "bare"                      # a model whose tokenizer never had the tags
    save_checkpoint(str(bare), model, build_char_tokenizer())
    tok_bare = ev.own_tokenizer(str(bare))
    with pytest.raises(ValueError, match="allow_untrained_tags"):
        ev.check_tags(tok_bare, str(bare), "unseen")
    assert ev.check_tags(tok_bare, str(bare), "seen", allow_untrained_tags=True) is False
    assert ev.check_tags(tok_bare, str(bare), "sequential") is False
    # the command line stops before sampling
    with pytest.raises(ValueError, match="allow_untrained_tags"):
        ev.run(ev.EvalConfig(model=str(bare), data="synthetic:easy:test",
                             out_dir=str(tmp_path / "o")))
    with pytest.raises(FileNotFoundError, match="no folder"):           # a path that does not exist
        ev.own_tokenizer(str(tmp_path / "nothing-here"))


def test_a_tokenizer_folder_as_model_says_so_before_the_tags(tmp_path, tiny):
    """eval.py --model=<a tokenizer's folder> asked for --allow_untrained_tags=True first; the
    missing model (no config.json) is said first, with --tokenizer's use (sft.py too)."""
    folder = tmp_path / "qwen3-tokenizer"
    build_char_tokenizer().save_pretrained(str(folder))
    said = (f"'{folder}' has no config.json: it holds a tokenizer, not a model; give --model a "
            "checkpoint or Hugging Face model folder, or train the tiny model on this tokenizer: "
            f"sft.py --model=tiny --tokenizer={folder}")
    with pytest.raises(FileNotFoundError) as refused:
        ev.run(ev.EvalConfig(model=str(folder), data="synthetic:easy:test",
                             out_dir=str(tmp_path / "o")))
    assert str(refused.value) == said
    with pytest.raises(FileNotFoundError) as refused:
        sft.setup(sft.SFTConfig(model=str(folder), out_dir=str(tmp_path / "s")), None, None)
    assert str(refused.value) == said


def test_run_writes_table_samples_and_summary(tmp_path, tiny):
    model, tok = tiny
    ckpt = str(tmp_path / "ckpt")
    save_checkpoint(ckpt, model, tok,
                    trainer_state={"config": {"mode": "seen", "style": "parallel",
                                              "preset": "tiny"}})
    out = tmp_path / "out"
    summary = ev.run(ev.EvalConfig(model=ckpt, data="synthetic:easy:test,synthetic:hard:test",
                                   limit=2, k=2, k_overrides="synthetic:hard:test=1",
                                   max_new_tokens=16, name="ours", out_dir=str(out),
                                   device="cpu"))
    assert summary["mode"] == "seen" and summary["mode_source"].endswith("trainer_state.pt")
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 2 + 2 * 1
    assert [x["benchmark"] for x in lines] == \
        ["synthetic:easy:test"] * 4 + ["synthetic:hard:test"] * 2
    for key in ("benchmark", "id", "prompt", "response", "extracted_answer", "gold", "correct",
                "reward", "has_parallel", "num_blocks", "T", "D"):
        assert key in lines[0]
    table = (out / "results.md").read_text()
    assert table.splitlines()[0] == ("| Method | Parallel % | synthetic:easy:test Mean@2 "
                                     "| synthetic:easy:test Pass@2 "
                                     "| synthetic:hard:test Mean@1 | Avg |")
    assert table.splitlines()[2].startswith("| ours | ")
    saved = json.loads((out / "summary.json").read_text())
    assert saved["benchmarks"]["synthetic:hard:test"]["k"] == 1 and saved["table"] == table.strip()
    assert saved["avg_mean_at_k"] == pytest.approx(ev.average_mean_at_k(saved["benchmarks"]))


def test_prompts_longer_than_the_context_are_skipped_and_counted(tmp_path, capfd):
    """The tiny model: context 512, one token per character, prompt = problem + "\\n" =
    len(problem) + 1 tokens. With max_new_tokens 8, a 503-character problem fills the context
    exactly (504 + 8 = 512) and fits; a 504-character one (513) does not."""
    assert ev.split_by_context([100, 256, 257], 256, 512) == ([0, 1], [2])
    assert ev.split_by_context([100, 10_000], 256, None) == ([0, 1], [])
    f = tmp_path / "long.jsonl"
    f.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n"
                         for p in ("What is 0+1?", "a" * 503, "b" * 504)))
    kw = dict(model="tiny", data=str(f), k=1, max_new_tokens=8, device="cpu")
    summary = ev.run(ev.EvalConfig(**kw, out_dir=str(tmp_path / "skip")))
    err = capfd.readouterr().err
    assert "1 of 3 problems have a prompt + max_new_tokens (8) longer than the model's context " \
           "(512 tokens; prompts are 13-505 tokens): skipped" in err
    assert summary["skipped_too_long"] == {str(f): ["long-2"]}
    assert summary["benchmarks"][str(f)]["num_problems"] == 2
    lines = [json.loads(x) for x in (tmp_path / "skip" / "samples.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == ["long-0", "long-1"]

    summary = ev.run(ev.EvalConfig(**kw, skip_long_prompts=False, out_dir=str(tmp_path / "keep")))
    assert "sampling them anyway (--skip_long_prompts=False)" in capfd.readouterr().err
    assert summary["skipped_too_long"] == {} and summary["benchmarks"][str(f)]["num_problems"] == 3

    with pytest.raises(ValueError, match="3 of 3 problems .* none is left: lower --max_new_tokens, "
                                         "or pass --skip_long_prompts=False"):
        ev.run(ev.EvalConfig(**dict(kw, max_new_tokens=500), out_dir=str(tmp_path / "none")))
    assert not (tmp_path / "none").exists()


def test_unknown_benchmark_is_a_clear_error_before_sampling(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="unknown dataset 'aime2024'"):
        ev.run(ev.EvalConfig(model="tiny", data="synthetic:easy:test,aime2024", out_dir=str(out),
                             device="cpu"))
    assert not out.exists()
    with pytest.raises(ValueError, match="not in --data"):
        ev.run(ev.EvalConfig(model="tiny", data="synthetic:easy:test", k_overrides="math500=1",
                             out_dir=str(out)))
    with pytest.raises(ValueError, match="benchmark=k"):
        ev.parse_k_overrides("math500:1")


@pytest.mark.parametrize("kw, flag", [(dict(data=""), "--data=''"),
                                      (dict(data=" , "), "--data=' , '"),
                                      (dict(limit=-1), "--limit=-1"), (dict(k=0), "--k=0"),
                                      (dict(device="cuda"), "--device=cuda"),
                                      (dict(device="mps"), "--device=mps"),
                                      (dict(max_blocks=-1), "--max_blocks=-1"),
                                      (dict(top_p=0.0), "--top_p=0.0")])
def test_bad_flags_are_one_error_before_anything_is_written(tmp_path, kw, flag):
    """An empty --data once wrote an empty table, --limit=-1 blamed the data set, --device=cuda on a
    CPU-only machine ended in torch's AssertionError, --top_p=0 quietly decoded greedily."""
    if kw.get("device") == "cuda" and torch.cuda.is_available() or kw.get("device") == "mps" and \
            torch.backends.mps.is_available():
        pytest.skip(f"this machine has {kw['device']}")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=f"^{re.escape(flag)}[: ]"):     # the bad flag alone, first
        ev.run(ev.EvalConfig(model="tiny", out_dir=str(out), **kw))
    assert not out.exists()


def test_a_failed_evaluation_keeps_the_earlier_samples(tmp_path, monkeypatch):
    """samples.jsonl is written as samples.jsonl.partial and renamed at the end (a failure once left
    it empty)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "samples.jsonl").write_text("earlier\n")

    def broken(*a, **kw):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(ev, "evaluate", broken)
    with pytest.raises(RuntimeError):
        ev.run(ev.EvalConfig(model="tiny", out_dir=str(out), limit=1, k=1))
    assert (out / "samples.jsonl").read_text() == "earlier\n"


def test_a_second_evaluation_into_one_folder_keeps_the_first(tmp_path):
    """A second eval.py run into one out_dir once overwrote the first's three files without a
    word."""
    out = tmp_path / "out"
    first = ev.run(ev.EvalConfig(model="tiny", data="synthetic:easy:test", out_dir=str(out),
                                 limit=1, k=1, name="a"))
    ev.run(ev.EvalConfig(model="tiny", data="synthetic:easy:test", out_dir=str(out), limit=1, k=1,
                         name="b"))
    assert sorted(os.listdir(out)) == ["earlier-1", "results.md", "samples.jsonl", "summary.json"]
    assert json.loads((out / "earlier-1" / "summary.json").read_text())["table"] == first["table"]
    assert json.loads((out / "summary.json").read_text())["name"] == "b"


def test_default_out_dirs_of_two_runs_checkpoints_differ(tmp_path, monkeypatch):
    """The default out_dir once came from the path's last two parts: runs/a/sft/checkpoint-1 and
    runs/b/sft/checkpoint-1 wrote into one folder, the second evaluation over the first."""
    monkeypatch.chdir(tmp_path)
    model, tok = load_model("tiny")
    out = []
    for run in ("a", "b"):
        save_checkpoint(ckpt := os.path.join("runs", run, "sft", "checkpoint-1"), model, tok)
        out.append(ev.run(ev.EvalConfig(model=ckpt, preset="tiny", data="synthetic:easy:test",
                                        limit=1, k=1))["name"])
    assert sorted(os.listdir(tmp_path / "runs" / "eval")) == \
        ["runs_a_sft_checkpoint-1", "runs_b_sft_checkpoint-1"]
    assert out == [os.path.join("sft", "checkpoint-1")] * 2   # the table's Method cell stays short


def test_rollout_stats_signal_of_the_choice_on_hand_made_rollouts():
    """block_accuracy_gap and mixed_groups on three groups of 4, by hand. Group 1: two with a
    block (1 right), two without (2 right): mixed. Group 2: four without (1 right). Group 3: four
    with a block (4 right). With a block: 6 responses, 5 right; without: 6, 3 right. Gap: 5/6 -
    3/6 = 1/3; mixed groups 1 of 3. All one kind: the gap is None."""
    from types import SimpleNamespace

    from attention import TagIds, parse_structure
    from model import tiny_tokenizer
    tok = tiny_tokenizer()
    tags = TagIds.from_tokenizer(tok)
    block = ("<Parallel><Path>1+2=3 vs 3: ok</Path><Path>1+3=4 vs 3: no</Path></Parallel>\n"
             "<Summary>1, 2</Summary>\nFinal Answer: 1, 2")
    chain = "1+2=3 vs 3: ok\nFinal Answer: 1, 2"

    def rollout(text):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        structure = parse_structure(ids, tags)
        return SimpleNamespace(structure=structure, num_tokens=len(ids), critical_path=len(ids),
                               finish_reason="eos")

    kinds = [block, block, chain, chain] + [chain] * 4 + [block] * 4
    right = [1, 0, 1, 1] + [1, 0, 0, 0] + [1, 1, 1, 1]
    rollouts = [rollout(text) for text in kinds]
    assert [bool(r.structure.blocks) for r in rollouts] == [text == block for text in kinds]
    scores = [{"reward": float(c), "correct": bool(c), "answer_found": True} for c in right]
    has_variance = torch.tensor([True, True, False])
    stats = ev.rollout_stats(rollouts, scores, has_variance, "cpu")
    assert stats["block_accuracy_gap"] == pytest.approx(5 / 6 - 3 / 6, abs=1e-12)
    assert stats["mixed_groups"] == pytest.approx(1 / 3, abs=1e-12)
    assert stats["parallel_ratio"] == 0.5 and stats["accuracy"] == 8 / 12
    only_chains = ev.rollout_stats(rollouts[4:8], scores[4:8], torch.tensor([True]), "cpu")
    assert only_chains["block_accuracy_gap"] is None and only_chains["mixed_groups"] == 0.0
