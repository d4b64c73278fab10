"""Building a model without weights costs no more than its modules: initializers on meta tensors
are skipped (inside empty_weights(), and around the build_fn of stage() and of a Pipeline's
stages), so the first build in a process does not import torch._dynamo (torch runs normal_ and
the truncated normal on meta through Python references that import it: 1.5 s and 150 MB once);
initializers on real tensors run as they would without it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

from trash_panda.offload.empty import empty_weights, no_init_on_meta

ROOT = Path(__file__).resolve().parents[2]


def fresh(code: str) -> str:
    """Runs ``code`` in a new interpreter (this one imported torch._dynamo long ago) and returns
    its last line of output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "examples")])}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=env, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def test_a_model_built_on_meta_does_not_import_dynamo() -> None:
    code = """
        import sys
        import torch
        from torch import nn
        from trash_panda.offload.empty import empty_weights, no_init_on_meta

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(1000, 64)
                self.proj = nn.Linear(64, 64)
                self.pos = nn.Parameter(torch.empty(16, 64))
                nn.init.trunc_normal_(self.pos, std=0.02)
                self.register_buffer("table", torch.arange(16.0))

        with empty_weights():
            a = Model()
        with no_init_on_meta(), torch.device("meta"):
            b = Model()
        metas = all(p.is_meta for m in (a, b) for p in m.parameters())
        print(metas, not a.table.is_meta, "torch._dynamo" in sys.modules)
    """
    # Without the skip the first line (the embedding's normal_) imports it.
    assert fresh(code) == "True True False"


def test_a_pipeline_of_plain_torch_models_does_not_import_dynamo(tmp_path: Path) -> None:
    code = f"""
        import sys
        from pathlib import Path
        import torch
        import pipeline_stages as ps

        folder = ps.save_pipeline(Path({str(tmp_path / "pipe")!r}))
        want = ps.plain(folder)
        before = "torch._dynamo" in sys.modules
        images = ps.with_runner(folder, runs=1)
        print(before, torch.equal(images[0], want), "torch._dynamo" in sys.modules)
    """
    assert fresh(code) == "False True False"


def test_real_tensors_are_initialized_as_without_it() -> None:
    torch.manual_seed(5)
    want = nn.Embedding(10, 4).weight.detach().clone()
    torch.manual_seed(5)
    with no_init_on_meta():
        got = nn.Embedding(10, 4).weight.detach().clone()
    assert torch.equal(got, want)
    # On meta, the skipped initializer returns its tensor, as the call would have.
    t = torch.empty(3, device="meta")
    with no_init_on_meta():
        assert nn.init.normal_(t) is t and t.normal_() is t


def test_the_shapes_of_a_model_built_without_weights_are_the_model_s() -> None:
    torch.manual_seed(0)
    real = nn.Sequential(nn.Embedding(50, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    with empty_weights():
        empty = nn.Sequential(nn.Embedding(50, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    assert [(n, p.shape, p.dtype) for n, p in empty.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in real.named_parameters()
    ]


def test_the_skip_holds_only_on_the_thread_that_builds() -> None:
    """A Pipeline builds the next stage on a thread of its own while the running stage computes:
    the mode that skips initializers must not reach the compute thread's calls."""
    import threading

    seen: list[int] = []
    go, looked = threading.Event(), threading.Event()

    def compute() -> None:
        go.wait(timeout=60)
        seen.append(torch._C._len_torch_function_stack())
        looked.set()

    t = threading.Thread(target=compute)
    t.start()
    with no_init_on_meta():
        assert torch._C._len_torch_function_stack() == 1
        go.set()
        assert looked.wait(timeout=60)
    t.join()
    assert seen == [0] and torch._C._len_torch_function_stack() == 0
