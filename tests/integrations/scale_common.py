"""Shared by the FSDP / DeepSpeed integration tests (tests/integrations/test_scale_*.py) and
their worker scripts: the tiny Llama, its data, what a worker records, and the checks the
tests make on it.

    tiny_llama(seed)      a transformers LlamaForCausalLM from a config, random init
                          (~330k parameters, no download)
    Counting              sequences start, start+k, ... (mod VOCAB): learnable in a few steps
    LossLog               the exact loss of every training forward (forward hook)
    full_state(model)     weights and FP8 state of a (possibly sharded) model, gathered
                          into plain tensors, keyed as in the unwrapped model
    check_resume(...)     the tests' assertions: the resumed run continues the full run's
                          losses and ends with its weights and FP8 state, bit for bit
    check_near_plain(...) the FP8 run's losses within a tolerance of the unconverted run
    launch_phases(...)    the two launches of a test file: "full" then "resume" (fresh processes)
    worker(...)           a worker's scenarios: the FP8 and plain runs, or the resumed FP8 run
    accelerate_run(...)   the training loop of the Accelerate tests (prepare, resume, save)

Every stack trains STEPS optimizer steps with a checkpoint after SAVE_AT, on 2 gloo
processes (tests/distributed/fsdp_launch.py), rank r reading its own half of each batch.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed"))
from fsdp_launch import get, init_worker, launch, run_scenarios  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 128
SEQ = 16
LOCAL_BATCH = 4
STEPS = 8
SAVE_AT = 4
LR = 3e-3
# the FP8 run's loss vs the same run without fp8mix's conversion (both from ln(128) ~ 4.85):
# FP8 rounding moves each step's loss by up to 1.7% here (measured per stack and rank in
# docs/integrations.md, most below 1%); a wrong scale, a stale FP8 weight or unsynchronised
# amaxes show as several percent or a loss that does not fall
NEAR_PLAIN_RTOL = 0.03


def tiny_llama(seed: int = 0):
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                                   tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg)


class Counting(torch.utils.data.Dataset):
    """Sequences start, start+k, start+2k, ... (mod VOCAB), k in {1, 2}."""

    def __init__(self, n: int = STEPS * LOCAL_BATCH * 2, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        k = torch.randint(1, 3, (n, 1), generator=g)
        self.ids = (start + k * torch.arange(SEQ)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def local_batch(step: int, rank: int) -> dict:
    """Rank `rank`'s half of global batch `step` (for the loops that feed batches themselves)."""
    ds = Counting()
    lo = (step * 2 + rank) * LOCAL_BATCH
    ids = ds.ids[lo:lo + LOCAL_BATCH]
    return {"input_ids": ids, "labels": ids}


def fp8_filter(module, fqn: str) -> bool:
    """lm_head stays in high precision (the usual choice; also keeps the loss comparable)."""
    return not fqn.endswith("lm_head")


class LossLog(list):
    """The exact loss of every training forward of `model` (the libraries log rounded means)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        model.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        if module.training and torch.is_grad_enabled():
            self.append(out.loss.detach().clone())


def _plain(t):
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().cpu().clone()


def full_state(model: torch.nn.Module) -> dict:
    """Weights and FP8 state of `model` as full plain tensors (every rank gets all of it):
    FSDP2 (DTensor) and plain modules through torch.distributed.checkpoint.state_dict,
    keys without wrapper prefixes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
    return {k: _plain(v) for k, v in sd.items()}


def only_fp8(state: dict) -> dict:
    return {k: v for k, v in state.items() if k.rsplit(".", 1)[-1].startswith("fp8_")}


def check_resume(full: dict, resumed: dict, *, what: str) -> None:
    """The resumed run (fresh processes, from the checkpoint after SAVE_AT steps) continues
    the full run bit for bit: losses of steps SAVE_AT+1.., and the final weights and FP8
    state (amax histories, scales, step counters, stream offsets; the stream keys too,
    as the checkpoint restores them)."""
    a, b = full["losses"][SAVE_AT:], resumed["losses"]
    assert len(a) == len(b) == STEPS - SAVE_AT, (what, len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"{what}: step {SAVE_AT + i + 1}: loss {x.item()!r} resumed as {y.item()!r}"
    fa, fb = full["state"], resumed["state"]
    assert fa.keys() == fb.keys(), (what, sorted(set(fa) ^ set(fb)))
    assert only_fp8(fa), f"{what}: no FP8 state in the final state dict"
    for k in fa:
        assert torch.equal(fa[k], fb[k]), f"{what}: {k} differs after the resume"


def check_near_plain(fp8: dict, plain: dict, *, what: str) -> None:
    """The FP8 run trains (its loss falls) and stays within NEAR_PLAIN_RTOL of the
    unconverted run, step by step; they are not equal (FP8 did run)."""
    a = torch.stack(fp8["losses"])
    b = torch.stack(plain["losses"])
    assert a.shape == b.shape == (STEPS,), (what, a.shape, b.shape)
    # (the HF Trainer's forward loss is the rank's token sum over the global token count: ~1/2 the mean)
    assert a[-1] < 0.95 * a[0], f"{what}: the FP8 run did not learn: {a.tolist()}"
    rel = ((a - b).abs() / b).max().item()
    print(f"{what}: FP8 vs plain, max relative loss difference {rel:.2e} over {STEPS} steps; "
          f"FP8 loss {a[0].item():.4f} -> {a[-1].item():.4f}")
    assert rel <= NEAR_PLAIN_RTOL, f"{what}: FP8 losses {a.tolist()}\nplain      {b.tolist()}\nmax rel {rel}"
    assert not torch.equal(a, b), f"{what}: the FP8 run equals the plain one (nothing ran in FP8?)"


def accelerate_fsdp_on_cpu(plugin):
    """An ``accelerate.Accelerator`` with `plugin` (a FullyShardedDataParallelPlugin) on CPU
    processes. Accelerate 1.15 records FSDP in ``AcceleratorState.__init__`` only for
    GPU-like devices (its ``distributed_type in [MULTI_GPU, MULTI_NPU, ...]`` branch); on a
    CPU the state stays MULTI_CPU and the plugin is dropped, so the Accelerator (and the HF
    Trainer, which reads ``accelerator.state.fsdp_plugin``) would silently run DDP. This
    sets what that branch sets (the state's distributed_type and fsdp_plugin, and the
    distributed_type it copies into PartialState's shared state); on GPUs
    ``Accelerator(fsdp_plugin=plugin)`` alone does it. The states are shared (Borgs): later
    Accelerators in the process, the Trainer's included, find them so."""
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return accelerator


def launch_phases(script: str, tmp_path_factory, name: str) -> tuple:
    """Launch `script` twice on 2 processes: phase "full" (the FP8 run, checkpointing after
    SAVE_AT steps, and the plain run), then phase "resume" (the FP8 run resumed from that
    checkpoint in fresh processes). Returns both launches' results."""
    ckpt = tmp_path_factory.mktemp(f"{name}_ckpt")
    full = launch(script, tmp_path_factory.mktemp(f"{name}_full"), args=("full", ckpt))
    resumed = launch(script, tmp_path_factory.mktemp(f"{name}_resume"), args=("resume", ckpt))
    return full, resumed


def assert_resumed(runs: tuple, what: str, key: str = "fp8") -> None:
    full, resumed = runs
    for rank, (a, b) in enumerate(zip(get(full, key), get(resumed, key))):
        check_resume(a, b, what=f"{what} rank {rank}")


def assert_near_plain(runs: tuple, what: str, fp8: str = "fp8", plain: str = "plain") -> None:
    full, _ = runs
    for rank, (a, b) in enumerate(zip(get(full, fp8), get(full, plain))):
        check_near_plain(a, b, what=f"{what} rank {rank}")


def worker(argv: list, train, extra: tuple = (), **env: str) -> None:
    """A worker of the tests that train through `train(rank, fp8=, ckpt=, resume=)`:
    argv is ``rank port out_dir phase ckpt_dir``; `extra` ((name, fn) pairs) runs after
    the full phase's runs; `env` is set before the process group."""
    rank, port, out_dir, phase, ckpt_dir = int(argv[0]), int(argv[1]), argv[2], argv[3], argv[4]
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", **env)
    init_worker(rank, port)
    ckpt = os.path.join(ckpt_dir, "state")
    if phase == "full":
        scenarios = [("fp8", lambda: train(rank, fp8=True, ckpt=ckpt)),
                     ("plain", lambda: train(rank, fp8=False, ckpt=ckpt + "_plain")), *extra]
    else:
        scenarios = [("fp8", lambda: train(rank, fp8=True, ckpt=ckpt, resume=True))]
    run_scenarios(rank, out_dir, scenarios)


def accelerate_run(accelerator, rank: int, *, fp8: bool, ckpt: str, resume: bool, check) -> tuple:
    """The loop of the Accelerate tests: the tiny Llama and AdamW through fp8mix's
    ``prepare`` (fp8) or ``accelerator.prepare`` alone; ``check(model)`` on the prepared
    model; ``load_state(ckpt)`` first when resuming, ``save_state(ckpt)`` after SAVE_AT
    steps in the FP8 run. Returns (prepared model, losses)."""
    from fp8mix.integrations.accelerate import prepare
    from fp8mix.recipe import DelayedScaling
    model = tiny_llama()
    losses = LossLog(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    if fp8:
        model, opt = prepare(accelerator, model, opt, recipe=DelayedScaling(amax_history_len=4),
                             module_filter_fn=fp8_filter)
    else:
        model, opt = accelerator.prepare(model, opt)
    check(model)
    start = 0
    if resume:
        accelerator.load_state(ckpt)
        start = SAVE_AT
    for step in range(start, STEPS):
        loss = model(**local_batch(step, rank)).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        if fp8 and not resume and step + 1 == SAVE_AT:
            accelerator.save_state(ckpt)
    return model, list(losses)
