"""scripts/look/draw_rollout.py: the picture of one rollout (its decode steps, lanes and Unseen
mask, checked on a hand-written response), the PNG from a tiny random model, and the error that
names `make demo` and --model."""
import os

import pytest

from attention import TagIds, parse_structure
from model import load_model
from sample import Rollout, critical_path
from scripts.look import draw_rollout

pytest.importorskip("matplotlib", reason="optional: pip install -r requirements-extra.txt")

# One block of two paths: "xy" and "z".
RESPONSE = "a<Parallel><Path>xy</Path><Path>z</Path></Parallel>\n<Summary>s</Summary>b"
#            a  <P> <A>  x  y </A> <A>  z </A> </P> \n <S>  s </S>  b eos
STEPS = [0, 1, 2, 3, 4, 5, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12]   # paths from <Parallel> + 1
LANES = [0, 0, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0]
RUNTIME_INJECTED = (2, 6, 9, 10, 11)           # both <Path>, </Parallel> \n <Summary>


@pytest.fixture(scope="module")
def tokenizer():
    return load_model("tiny")[1]


def hand_rollout(tokenizer) -> Rollout:
    tags = TagIds.from_tokenizer(tokenizer)
    prompt_ids = tokenizer.encode("Q\n", add_special_tokens=False)
    ids = tokenizer.encode(RESPONSE, add_special_tokens=False) + [tags.eos]
    structure = parse_structure(ids, tags)
    sampled = [0 if i in RUNTIME_INJECTED else 1 for i in range(len(ids))]
    return Rollout(prompt_index=0, prompt_ids=prompt_ids, response_ids=ids, sampled_mask=sampled,
                   logprobs=[0.0] * len(ids), structure=structure, num_tokens=len(ids),
                   critical_path=critical_path(structure, "unseen"), finish_reason="eos")


def test_steps_lanes_and_mask_of_a_hand_written_response(tokenizer, tmp_path):
    rollout = hand_rollout(tokenizer)
    assert len(rollout.response_ids) == len(STEPS)
    steps = draw_rollout.decode_steps(rollout.structure, "unseen")
    assert steps == STEPS
    assert max(steps) + 1 == rollout.critical_path == 13            # D = 16 - (4 + 3) + 4
    assert draw_rollout.decode_steps(rollout.structure, "seen") == list(range(16))
    assert draw_rollout.lanes(rollout.structure) == LANES
    picture = draw_rollout.mask_picture(rollout, TagIds.from_tokenizer(tokenizer))
    hidden = (picture == draw_rollout.UNSEEN_HIDDEN).nonzero().tolist()
    prompt = len(rollout.prompt_ids)
    # Path 2's rows (<Path> z </Path>: 6-8) do not see path 1 (2-5); nothing else is hidden.
    path_2_rows = (6, 7, 8)
    path_1_columns = (2, 3, 4, 5)
    assert hidden == [[prompt + row, prompt + column]
                      for row in path_2_rows for column in path_1_columns]
    out = draw_rollout.draw(rollout, tokenizer, "unseen", "a hand-written response",
                            str(tmp_path / "hand.png"))
    assert os.path.getsize(out) > 0


def test_draws_a_png_from_a_tiny_random_model(tmp_path):
    out = str(tmp_path / "rollout.png")
    written = draw_rollout.main(["--model=tiny", "--n=2", "--max_new_tokens=24", f"--out={out}"])
    assert written == out
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_missing_checkpoint_names_make_demo_and_model(tmp_path, monkeypatch):
    monkeypatch.setattr(draw_rollout, "ROOT", str(tmp_path))      # no runs/demo/grpo there
    with pytest.raises(FileNotFoundError, match=r"make demo.*--model="):
        draw_rollout.main([f"--out={tmp_path / 'never.png'}"])
    with pytest.raises(FileNotFoundError, match=r"holds no model.*--model="):
        draw_rollout.resolve_checkpoint(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_run_folder_means_its_latest_checkpoint(tmp_path):
    for step in (9, 10, 100):
        os.makedirs(tmp_path / f"checkpoint-{step}")
    os.makedirs(tmp_path / "checkpoint-final.tmp")
    assert draw_rollout.resolve_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-100")
