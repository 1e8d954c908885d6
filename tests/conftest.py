"""Test settings: nothing waits on the Hugging Face hub; tests run from the repository root imports."""
import os
import sys

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

# Tiny models run faster on one thread (per-op overhead dominates), and several test processes
# (2-rank gloo tests, the reward workers) must not oversubscribe a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def wandb_rows(tmp_path, monkeypatch) -> list[dict]:
    """The real wandb in offline mode under tmp_path, and the rows its runs log (Run.log still runs)."""
    wandb = pytest.importorskip("wandb", reason="optional: pip install -r requirements-extra.txt")
    for k, v in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(k, v)
    logged, real_log = [], wandb.Run.log
    monkeypatch.setattr(wandb.Run, "log", lambda self, row, *a, **kw: logged.append(dict(row)) or
                        real_log(self, row, *a, **kw))
    return logged

