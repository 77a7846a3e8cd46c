"""fp8mix.Linear under data parallelism: 2 CPU processes on gloo.

One launch of 2 worker processes (this file run as a script) runs every scenario and
saves what it saw; the tests below read those results:
  * DDP, delayed scaling (amaxes all-reduced with MAX over the world group) and current
    scaling, different data per rank, several AdamW steps: FP8 state (fp8_scale,
    fp8_amax_history, fp8_steps) and parameters bit-identical on both ranks, and the
    global loss equal to a single-process run on the concatenated batch;
  * FSDP2 (fully_shard per layer and at the root), same model and data: runs forward,
    backward and step; losses finite and close to DDP's. (FSDP2 re-fills the same
    unsharded Parameter each step with its version counter preserved, so this also
    checks that every rank re-casts the new weight: a stale FP8 weight shows in the
    losses, and a cache hit on one rank but not the other desynchronises the amax
    all-reduce -- a gloo timeout, reported as that scenario's failure.)

Why a tolerance and not equality against the single process: with all-reduced amaxes
every rank casts with the scales the single process uses (the per-rank grad_output is
2x the single process's -- mean over half the batch -- and so are its amax and 1/scale,
exactly, so the FP8 codes are the same). What differs is float32 arithmetic: wgrad is
summed over each half and then averaged by DDP instead of summed once, and the loss is
a mean of means. Those ~1e-7 relative differences move the weights by a few ulps, which
can flip the FP8 rounding of a few weight elements at later steps; that moves the loss
by ~1e-5 relative. Observed here: <= 2e-7 over 6 steps (FSDP2 vs DDP: 0). rtol=1e-4
leaves room for such flips and is still far tighter than what a real bug shows
(unsynchronised scales, a stale FP8 weight, a wrong gradient average: 1e-2 and up).
"""
from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from helpers import fp8_state

from fp8mix.nn.fp8_state import FP8_STATE_KEYS

WORLD = 2
STEPS = 6
B_LOCAL = 16
DIMS = (32, 64, 64, 16)
TIMEOUT_S = 90

dist_ok = torch.distributed.is_available() and torch.distributed.is_gloo_available()
pytestmark = pytest.mark.skipif(not dist_ok, reason="torch.distributed with gloo not available")


# --------------------------------------------------------------------------------------
# shared by the workers and the single-process reference
# --------------------------------------------------------------------------------------
def make_model():
    import torch.nn as nn

    import fp8mix
    torch.manual_seed(0)
    d = DIMS
    return nn.Sequential(fp8mix.Linear(d[0], d[1]), nn.ReLU(), fp8mix.Linear(d[1], d[2]), nn.GELU(),
                         fp8mix.Linear(d[2], d[3]))


def make_recipe(name):
    from fp8mix.recipe import CurrentScaling, DelayedScaling
    return DelayedScaling(amax_history_len=8) if name == "delayed" else CurrentScaling()


def global_batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(WORLD * B_LOCAL, DIMS[0], generator=gen)
    x[:B_LOCAL] *= 3.0  # rank 0's half has the larger amax: the all-reduce matters
    teach = torch.Generator().manual_seed(7)  # a fixed teacher: something to learn
    a = torch.randn(DIMS[0], DIMS[-1], generator=teach) / DIMS[0] ** 0.5
    t = torch.tanh(x @ a) + 0.1 * torch.randn(WORLD * B_LOCAL, DIMS[-1], generator=gen)
    return x, t


def train(model, params, recipe_name, rank=None, steps=STEPS, first_state=None):
    """AdamW steps; returns per-step losses of this process's batch (and appends the FP8
    state after the first step to `first_state`, when given)."""
    import torch.nn.functional as F

    import fp8mix
    opt = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for step in range(steps):
        x, t = global_batch(step)
        if rank is not None:
            x, t = x[rank * B_LOCAL:(rank + 1) * B_LOCAL], t[rank * B_LOCAL:(rank + 1) * B_LOCAL]
        with fp8mix.fp8_autocast(fp8_recipe=make_recipe(recipe_name)):
            loss = F.mse_loss(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if first_state is not None and step == 0:
            first_state.append(fp8_state(model.module if hasattr(model, "module") else model))
    return losses


# --------------------------------------------------------------------------------------
# worker (this file as a script)
# --------------------------------------------------------------------------------------
def _global_losses(losses):
    import torch.distributed as dist
    t = torch.stack(losses)
    dist.all_reduce(t)
    return (t / WORLD).tolist()


def _run_ddp(rank, recipe_name):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = make_model()
    ddp = DDP(model)
    first: list = []
    losses = train(ddp, ddp.parameters(), recipe_name, rank, first_state=first)
    return {
        "losses": _global_losses(losses),
        "fp8_first": first[0],
        "params": {k: v.detach().clone() for k, v in model.named_parameters()},
        "fp8": fp8_state(model),
    }


def _run_fsdp2(rank, recipe_name):
    from torch.distributed.fsdp import fully_shard
    model = make_model()
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    losses = train(model, model.parameters(), recipe_name, rank)
    full = {}
    for k, v in model.named_parameters():
        full[k] = v.full_tensor().detach().clone() if hasattr(v, "full_tensor") else v.detach().clone()
    return {"losses": _global_losses(losses), "params": full, "fp8": fp8_state(model)}


def _run_mismatch(rank, _recipe_name):
    """Rank 0 in DelayedScaling, rank 1 in CurrentScaling: must be a clear error, never a hang."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(make_model())
    train(ddp, ddp.parameters(), "delayed" if rank == 0 else "current", rank, steps=1)
    return {"trained": True}


def _run_grouped(rank, _recipe_name):
    """fp8mix.GroupedLinear under DDP: the default DelayedScaling (amaxes all-reduced) is a
    clear NotImplementedError on every rank; with reduce_amax=False it trains, each rank
    scaling from its own tokens, the weights identical across ranks."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fp8mix
    from fp8mix.recipe import DelayedScaling
    torch.manual_seed(0)
    ddp = DDP(fp8mix.GroupedLinear(4, 32, 32))
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)
    splits = [5, 0, 7 + rank, 3]
    out = {"initial": [w.detach().clone() for w in ddp.module.weights()]}
    try:
        with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
            ddp(torch.randn(sum(splits), 32, generator=gen), splits)
    except NotImplementedError as e:
        out["default_error"] = str(e)
    for _ in range(3):
        with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling(reduce_amax=False)):
            loss = ddp(torch.randn(sum(splits), 32, generator=gen), splits).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out["weights"] = [w.detach().clone() for w in ddp.module.weights()]
    out["steps"] = ddp.module.fp8_steps.clone()
    return out


def _worker(rank, port, out_dir):
    import datetime
    import traceback

    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=20))
    results = {}
    for name, fn, rec in (("ddp_delayed", _run_ddp, "delayed"), ("ddp_current", _run_ddp, "current"),
                          ("fsdp2_delayed", _run_fsdp2, "delayed"), ("grouped", _run_grouped, ""),
                          ("mismatch", _run_mismatch, "")):
        t0 = time.time()
        try:
            results[name] = fn(rank, rec)
        except Exception as e:  # noqa: BLE001  -- reported per scenario by the tests
            results[name] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"}
            torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
            break  # a collective may now be out of step: stop here
        results[name]["seconds"] = time.time() - t0
        dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), str(r), str(port), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    logs = []
    deadline = time.time() + TIMEOUT_S
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1, deadline - time.time()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            logs.append(p.communicate()[0])
            pytest.fail(f"distributed workers timed out after {TIMEOUT_S}s:\n" + "\n".join(log[-2000:] for log in logs))
    res = []
    for r in range(WORLD):
        f = out / f"rank{r}.pt"
        if not f.exists():
            pytest.fail(f"rank {r} saved no results (exit {procs[r].returncode}):\n{logs[r][-4000:]}")
        res.append(torch.load(f))
    return res


def _get(runs, name):
    for r, res in enumerate(runs):
        if name not in res:
            pytest.fail(f"{name}: not run on rank {r} (an earlier scenario failed)")
        if "error" in res[name]:
            pytest.fail(f"{name} failed on rank {r}: {res[name]['error']}")
    return [res[name] for res in runs]


def test_recipes_differing_across_ranks_are_a_clear_error(runs):
    """Every rank raises a ValueError naming the first FP8 layer and the ranks that differ
    (the workers' gloo timeout is 20 s: a hang would fail the fixture instead)."""
    for r, res in enumerate(runs):
        err = res["mismatch"].get("error", "")
        assert err.startswith("ValueError: fp8mix.Linear"), (r, err[:300])
        assert "run different FP8 recipes" in err and f"ranks [{1 - r}] differ" in err, (r, err[:300])
        assert ("DelayedScaling" if r == 0 else "CurrentScaling") in err.splitlines()[0]


def test_grouped_linear_under_ddp(runs):
    got = _get(runs, "grouped")
    for r in got:
        assert "reduce_amax=False" in r["default_error"] and "grouped GEMMs" in r["default_error"]
    for a, b in zip(got[0]["weights"], got[1]["weights"]):
        assert torch.equal(a, b)  # DDP's averaged gradients: the same weights on every rank
    assert not torch.equal(got[0]["weights"][0], got[0]["initial"][0])  # (they trained)
    assert int(got[0]["steps"][0]) == 3 and int(got[1]["steps"][0]) == 3


def _single_process(recipe_name):
    model = make_model()
    first: list = []
    losses = train(model, model.parameters(), recipe_name, first_state=first)
    return [v.item() for v in losses], model, first[0]


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_ddp_ranks_identical(runs, recipe):
    r0, r1 = _get(runs, f"ddp_{recipe}")
    assert r0["fp8"].keys() == r1["fp8"].keys()
    assert len(r0["fp8"]) == 3 * len(FP8_STATE_KEYS)  # 3 layers x (history, scale, steps, grad_pending, ...)
    for k, v in r0["fp8"].items():
        assert torch.equal(v, r1["fp8"][k]), f"FP8 state {k} differs between ranks:\n{v}\n{r1['fp8'][k]}"
    if recipe == "delayed":
        steps = [v for k, v in r0["fp8"].items() if k.endswith("fp8_steps")]
        assert all(s.tolist() == [STEPS, STEPS, STEPS - 1] for s in steps), steps  # the last grad amax pending
        pend = [v for k, v in r0["fp8"].items() if k.endswith("fp8_grad_pending")]
        assert all((p >= 0).sum() == 1 for p in pend), pend
    for k, v in r0["params"].items():
        assert torch.equal(v, r1["params"][k]), f"parameter {k} differs between ranks"


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_ddp_matches_single_process(runs, recipe):
    r0, _ = _get(runs, f"ddp_{recipe}")
    single, model, first = _single_process(recipe)
    ddp = r0["losses"]
    rel = [abs(a - b) / abs(b) for a, b in zip(ddp, single)]
    assert max(rel) <= 1e-4, f"DDP losses {ddp}\nsingle     {single}\nrel {rel}"
    assert ddp[-1] < ddp[0]
    for k, p in model.named_parameters():
        torch.testing.assert_close(r0["params"][k], p.detach(), rtol=1e-2, atol=1e-3, msg=lambda m: f"{k}: {m}")
    if recipe == "delayed":
        # after the first step (same weights, same global batch) the FP8 state is the single
        # process's exactly: input and weight amaxes and scales equal, and the pending
        # grad_output amax exactly 2x (each rank's loss is a mean over half the batch)
        for k, v in r0["fp8_first"].items():
            ref = first[k]
            if k.endswith("fp8_grad_pending"):
                assert torch.equal(v.max(), 2 * ref.max()), (k, v, ref)
            elif k.endswith(("fp8_scale", "fp8_amax_history")):
                assert torch.equal(v[..., :2], ref[..., :2]), (k, v, ref)
            elif not k.endswith("fp8_rng"):  # (stream keys are per process)
                assert torch.equal(v, ref), k
        # later steps: the weights differ by float32 summation order (module docstring), so
        # the scales agree within the relative size of those differences
        sd = model.state_dict()
        for k, v in r0["fp8"].items():
            if k.endswith("fp8_scale"):
                torch.testing.assert_close(v[:2], sd[k][:2], rtol=1e-3, atol=0)


def test_fsdp2_trains_like_ddp(runs):
    f0, f1 = _get(runs, "fsdp2_delayed")
    d0, _ = _get(runs, "ddp_delayed")
    assert all(math.isfinite(v) for v in f0["losses"]), f0["losses"]
    rel = [abs(a - b) / abs(b) for a, b in zip(f0["losses"], d0["losses"])]
    assert max(rel) <= 1e-4, f"FSDP2 losses {f0['losses']}\nDDP losses   {d0['losses']}\nrel {rel}"
    assert f0["fp8"].keys() == f1["fp8"].keys() and len(f0["fp8"]) == 3 * len(FP8_STATE_KEYS)
    for k, v in f0["fp8"].items():
        assert torch.equal(v, f1["fp8"][k]), f"FP8 state {k} differs between FSDP2 ranks"
    for k, v in f0["params"].items():
        torch.testing.assert_close(v, d0["params"][k], rtol=1e-2, atol=1e-3, msg=lambda m: f"{k}: {m}")


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
