"""The session's fed-input evidence (runtime.session.batches.FedInputs, runtime.session.global_hooks):
nothing of ours enters the user's model or optimizer, and the batch is told from the state carried
into the forward."""

from __future__ import annotations

import copy
import gc
import io
import pickle

import pytest
import torch
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer

from runtime.session import global_hooks
from runtime.session.batches import FedInputs, split_carried
from runtime.session.step_evidence import StepEvidence


class RecurrentLM(torch.nn.Module):
    """word_language_model's shape: forward(input, hidden), the hidden state carried across steps."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(9, 4)
        self.rnn = torch.nn.LSTM(4, 4, batch_first=True, dropout=0.0)
        self.drop = torch.nn.Dropout(0.5)
        self.head = torch.nn.Linear(4, 9)

    def forward(self, input: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple:
        out, hidden = self.rnn(self.embed(input), hidden)
        return self.head(self.drop(out)), hidden


SAFE = [RecurrentLM, torch.nn.Embedding, torch.nn.LSTM, torch.nn.Dropout, torch.nn.Linear]


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, hidden: object) -> tuple:
    out, hidden = model(x, hidden)
    out.sum().backward()
    opt.step()
    return tuple(h.detach() for h in hidden)


def hooks_of(model: torch.nn.Module) -> list[object]:
    return [h for m in model.modules() for d in (m._forward_pre_hooks, m._forward_hooks) for h in d.values()]


def saved_and_loaded(model: torch.nn.Module) -> torch.nn.Module:
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    with torch.serialization.safe_globals(SAFE):
        return torch.load(buf, weights_only=True)


def test_the_whole_model_saves_and_loads_weights_only_before_and_after_the_first_forward() -> None:
    """pytorch/examples' word_language_model: `torch.save(model, f)`, then `torch.load(f,
    weights_only=True)`. With a pre-hook on the module it failed before the first forward (a
    local closure) and after it (the hook pickled into the file)."""
    model = RecurrentLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ev = StepEvidence()
    ev.watch("model", model)
    ev.watch("optimizer", opt)
    ev.trains_from({"model": model, "optimizer": opt}, 0)  # a closure waits for the first forward
    assert not hooks_of(model) and not opt._optimizer_step_post_hooks
    before = saved_and_loaded(model)
    hidden = train_step(model, opt, torch.randint(0, 9, (2, 3)), None)
    after = saved_and_loaded(model)
    for loaded in (before, after, copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(loaded) is RecurrentLM and not hooks_of(loaded)
    assert all(torch.equal(a, b) for a, b in zip(after.state_dict().values(), model.state_dict().values()))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    opt_copy = copy.deepcopy(opt)  # the optimizer too: its step count is kept by a global hook
    assert not opt_copy._optimizer_step_post_hooks
    train_step(model, opt, torch.randint(0, 9, (2, 3)), hidden)
    assert ev.step_fields(None)["opt_steps"] == 2  # still counted after the round trips


def test_a_copy_of_a_watched_model_is_not_watched_and_a_collected_watcher_lets_go() -> None:
    gc.collect()
    watched, pre = global_hooks.watched(), len(torch_module._global_forward_pre_hooks)
    model = RecurrentLM()
    fed = FedInputs()
    fed.watch(model)
    twin = copy.deepcopy(model)
    twin(torch.randint(0, 9, (2, 3)))
    assert fed.take() is None  # the copy's forwards are not the tracked model's
    model(torch.randint(0, 9, (2, 3)))
    assert fed.take() is not None
    del fed
    gc.collect()
    assert global_hooks.watched() == watched and len(torch_module._global_forward_pre_hooks) == pre
    if not watched:  # the last watcher gone: torch's no-hook fast path is back
        assert not torch_module._global_forward_pre_hooks and not torch_module._global_forward_hooks
        assert not torch_module._global_forward_hooks_with_kwargs


def test_many_sessions_in_one_process_leave_no_hook_behind() -> None:
    """Tests make many sessions: each one's hooks go with it, and a model a newer watcher takes
    over is hashed by that one only."""
    gc.collect()
    watched, opt_hooks = global_hooks.watched(), len(torch_optimizer._global_optimizer_post_hooks)
    model = RecurrentLM()
    for _ in range(50):
        ev = StepEvidence()
        ev.watch("model", model)
        ev.watch("optimizer", torch.optim.SGD(model.parameters(), lr=0.1))
    old = FedInputs()
    old.watch(model)
    new = FedInputs()
    new.watch(model)
    model(torch.randint(0, 9, (2, 3)))
    assert old.take() is None and new.take() is not None
    new.close()
    model(torch.randint(0, 9, (2, 3)))
    assert new.take() is None
    del ev, old, new
    gc.collect()
    assert global_hooks.watched() == watched and len(torch_optimizer._global_optimizer_post_hooks) <= max(opt_hooks, 1)
    assert len(torch_module._global_forward_pre_hooks) <= 1  # one pair for the whole process, at most


def test_the_rng_is_re_applied_before_the_first_forward_draws() -> None:
    """`first` runs before the forward (dropout draws after it): the RNG a resume puts back there
    is the one the forward uses."""
    torch.manual_seed(0)
    model = RecurrentLM()
    x = torch.randint(0, 9, (2, 3))
    saved = torch.get_rng_state()
    want = model(x)[0]
    fed = FedInputs()
    fed.watch(model)
    torch.rand(5)  # the global RNG drawn between the restore and the forward
    fed.first = lambda: torch.set_rng_state(saved)
    assert torch.equal(model(x)[0], want)


def test_the_rng_at_each_steps_first_forward_is_printed_after_first_and_only_once_a_step() -> None:
    """`rng_in`: the global RNG as the step's first training forward found it (after `first` put
    one back), not as a later micro-batch's forward found it; a draw before the forward shows."""
    from runtime.session.batches import rng_digest

    torch.manual_seed(0)
    model = RecurrentLM()
    x = torch.randint(0, 9, (2, 3))
    fed = FedInputs()
    fed.watch(model)
    before = rng_digest()
    model(x), model(x)  # two micro-batches: dropout draws between them
    fields = fed.step_fields()
    assert fields["rng_in"] == before and fields["batch_from"] == "forward" and rng_digest() != before
    saved = torch.get_rng_state()
    torch.rand(3)  # a draw between the checkpoint and the next step (an evaluation, say)
    drawn = rng_digest()
    model(x)
    assert fed.step_fields()["rng_in"] == drawn != before
    torch.set_rng_state(saved)
    restored = rng_digest()
    torch.rand(3)
    fed.first = lambda: torch.set_rng_state(saved)  # put back before the forward: the digest says so
    model(x)
    assert fed.step_fields()["rng_in"] == restored
    with torch.no_grad():
        model(x)  # an evaluation forward: no step fields
    assert fed.step_fields() == {}


def test_the_hidden_state_is_hashed_apart_from_the_batch_by_its_argument_name() -> None:
    model = RecurrentLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ev = StepEvidence()
    ev.watch("model", model)
    ev.watch("optimizer", opt)
    x = torch.randint(0, 9, (2, 3))
    hidden = train_step(model, opt, x, None)
    first = ev.step_fields(x)
    assert "fed_state" not in first  # hidden None: nothing carried yet
    train_step(model, opt, x, hidden)
    carried = ev.step_fields(x)
    assert carried["batch_hash"] == first["batch_hash"] and set(carried["fed_state"]) == {"hidden"}
    train_step(model, opt, x, tuple(torch.zeros_like(h) for h in hidden))  # a zeroed state: same batch
    zeroed = ev.step_fields(x)
    assert zeroed["batch_hash"] == first["batch_hash"] and zeroed["fed_state"] != carried["fed_state"]
    model(input=x, hidden=hidden)[0].sum().backward()  # by keyword: the same names
    assert ev.step_fields(None)["fed_state"] == carried["fed_state"]
    assert ev.step_fields(None)["opt_steps_all"] == 3


@pytest.mark.parametrize(
    "named,batch",
    [
        ({"input": torch.ones(1), "hx": torch.ones(1)}, {"input"}),
        ({"input_ids": torch.ones(1), "past_key_values": [torch.ones(1)], "mems": None}, {"input_ids"}),
        ({"input": 1, "hidden": torch.ones(1)}, {"input", "hidden"}),  # no tensor but the state's: the batch
        ({"state": torch.ones(1)}, {"state"}),  # an RL policy's forward(state): the batch
    ],
)
def test_carried_state_by_name(named: dict, batch: set) -> None:
    got_batch, got_state = split_carried(named)
    assert set(got_batch) == batch and set(got_state) == set(named) - batch


def test_no_optimizer_at_all_is_counted_as_none_stepped() -> None:
    """A manual SGD on p.data: no optimizer object steps anywhere, `opt_steps_all` says 0."""
    model = torch.nn.Linear(3, 1)
    ev = StepEvidence()
    ev.watch("model", model)
    model(torch.ones(2, 3)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    fields = ev.step_fields(None)
    assert fields["opt_steps_all"] == 0 and "opt_steps" not in fields
    torch.optim.SGD(model.parameters(), lr=0.1).step()  # an untracked one: counted among all
    assert ev.step_fields(None)["opt_steps_all"] == 1


def test_a_model_compiled_after_it_was_tracked_is_hashed_as_in_eager() -> None:
    """torch traces a module's hooks into the graph while a global hook exists: the compiled
    wrapper's call is taken for the tracked model's (one graph, no break; each forward once)."""
    model = RecurrentLM()
    fed = FedInputs()
    fed.watch(model)
    xs = [torch.full((2, 3), i) for i in range(3)]
    h = (torch.ones(1, 2, 4), torch.ones(1, 2, 4))
    eager = []
    for x in xs:
        model(x, h)
        eager.append((fed.take(), fed.take_state()))
    compiled = torch.compile(model, backend="eager")
    for x, want in zip(xs, eager):
        compiled(x, h)
        assert (fed.take(), fed.take_state()) == want
    fed.close()
