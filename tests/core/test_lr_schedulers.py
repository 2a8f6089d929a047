"""Learning-rate schedulers against PyTorch's, per parameter group, over 100 steps; chaining,
manual changes and state round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest

import everyo as eo

LRS = (0.1, 0.02)


def _optimizers(torch, name="SGD", **options):
    ours_params = [eo.Parameter([1.0]), eo.Parameter([2.0])]
    theirs_params = [torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))]
    ours = getattr(eo, name)([{"params": [p], "lr": lr} for p, lr in zip(ours_params, LRS)],
                             **options)
    theirs = getattr(torch.optim, name)([{"params": [p], "lr": lr}
                                         for p, lr in zip(theirs_params, LRS)], **options)
    return ours, theirs


def _schedules(torch):
    """(id, make EveryO's, make PyTorch's, optimizer options); each factory takes the
    optimizer and the scheduler namespace (``eo`` or ``torch.optim.lr_scheduler``)."""
    return [
        ("lambda", lambda o, ns: ns.LambdaLR(o, lambda e: 0.97 ** e / (1 + e % 7))),
        ("lambda_per_group", lambda o, ns: ns.LambdaLR(o, [lambda e: 1 / (e + 1),
                                                           lambda e: 0.9 ** e])),
        ("multiplicative", lambda o, ns: ns.MultiplicativeLR(o, lambda e: 0.95 + 0.01 * (e % 3))),
        ("step", lambda o, ns: ns.StepLR(o, step_size=7, gamma=0.3)),
        ("multistep", lambda o, ns: ns.MultiStepLR(o, milestones=[30, 10, 60, 60], gamma=0.4)),
        ("linear", lambda o, ns: ns.LinearLR(o, start_factor=0.1, end_factor=0.9,
                                             total_iters=30)),
        ("exponential", lambda o, ns: ns.ExponentialLR(o, gamma=0.97)),
        ("cosine", lambda o, ns: ns.CosineAnnealingLR(o, T_max=30, eta_min=0.001)),
        ("one_cycle", lambda o, ns: ns.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=101)),
        ("one_cycle_linear_three_phase",
         lambda o, ns: ns.OneCycleLR(o, max_lr=0.3, total_steps=100, anneal_strategy="linear",
                                     three_phase=True, cycle_momentum=False)),
        ("warm_restarts", lambda o, ns: ns.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2,
                                                                       eta_min=1e-4)),
        ("sequential", lambda o, ns: ns.SequentialLR(
            o, [ns.LinearLR(o, start_factor=0.01, total_iters=10),
                ns.CosineAnnealingLR(o, T_max=90, eta_min=1e-5)], milestones=[10])),
        ("sequential_three", lambda o, ns: ns.SequentialLR(
            o, [ns.ExponentialLR(o, gamma=0.9), ns.StepLR(o, 5, gamma=0.5),
                ns.ExponentialLR(o, gamma=1.01)], milestones=[20, 60])),
    ]


SCHEDULE_IDS = [case[0] for case in _schedules(None)]


def _run(optimizer, scheduler, steps, momentum_key="momentum"):
    lrs, momenta = [], []
    for _ in range(steps):
        optimizer.step()  # no gradients: parameters stay, only the order matters
        scheduler.step()
        lrs.append([g["lr"] for g in optimizer.param_groups])
        momenta.append([g.get(momentum_key) for g in optimizer.param_groups])
        assert list(scheduler.get_last_lr()) == lrs[-1]
    return np.array(lrs), momenta


@pytest.mark.parametrize("case_id", SCHEDULE_IDS)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_matches_pytorch_over_100_steps(case_id, torch):
    make = {c[0]: c[1] for c in _schedules(torch)}[case_id]
    ours_opt, theirs_opt = _optimizers(torch, momentum=0.9)
    ours = make(ours_opt, eo)
    theirs = make(theirs_opt, torch.optim.lr_scheduler)
    assert ours.get_last_lr() == theirs.get_last_lr()
    ours_lrs, ours_mom = _run(ours_opt, ours, 100)
    theirs_lrs, theirs_mom = _run(theirs_opt, theirs, 100)
    np.testing.assert_allclose(ours_lrs, theirs_lrs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.array(ours_mom, float), np.array(theirs_mom, float),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_one_cycle_cycles_adams_beta1(torch):
    ours_opt, theirs_opt = _optimizers(torch, name="AdamW")
    ours = eo.OneCycleLR(ours_opt, max_lr=0.01, total_steps=50)
    theirs = torch.optim.lr_scheduler.OneCycleLR(theirs_opt, max_lr=0.01, total_steps=50)
    ours_lrs, ours_betas = _run(ours_opt, ours, 49, momentum_key="betas")
    theirs_lrs, theirs_betas = _run(theirs_opt, theirs, 49, momentum_key="betas")
    np.testing.assert_allclose(ours_lrs, theirs_lrs, rtol=1e-12)
    np.testing.assert_allclose(np.array(ours_betas, float), np.array(theirs_betas, float),
                               rtol=1e-12)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_two_schedulers_and_a_manual_change_compose(torch):
    # Chainable: a second scheduler and a manual lr edit multiply in, as in PyTorch.
    ours_opt, theirs_opt = _optimizers(torch)
    runs = []
    for opt, ns in ((ours_opt, eo), (theirs_opt, torch.optim.lr_scheduler)):
        first, second = ns.ExponentialLR(opt, gamma=0.9), ns.StepLR(opt, step_size=3, gamma=0.5)
        lrs = []
        for step in range(30):
            if step == 10:
                opt.param_groups[1]["lr"] = 0.5
            opt.step()
            first.step()
            second.step()
            lrs.append([g["lr"] for g in opt.param_groups])
        runs.append(lrs)
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-12)
    assert runs[0][10][1] != pytest.approx(runs[0][10][0] * LRS[1] / LRS[0])  # edit kept


@pytest.mark.parametrize("case_id", ["cosine", "sequential", "one_cycle", "warm_restarts",
                                     "multiplicative"])
def test_state_dict_resumes_the_sequence(case_id, tmp_path):
    make = {c[0]: c[1] for c in _schedules(None)}[case_id]

    def fresh():
        params = [eo.Parameter([1.0]), eo.Parameter([2.0])]
        opt = eo.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, LRS)], momentum=0.9)
        return opt, make(opt, eo)

    opt, sched = fresh()
    straight, _ = _run(opt, sched, 40)
    opt, sched = fresh()
    _run(opt, sched, 15)
    eo.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()},
            tmp_path / "ckpt.npz")
    checkpoint = eo.load(tmp_path / "ckpt.npz")
    opt, sched = fresh()
    opt.load_state_dict(checkpoint["optimizer"])
    sched.load_state_dict(checkpoint["scheduler"])
    resumed, _ = _run(opt, sched, 25)
    np.testing.assert_array_equal(resumed, straight[15:])


def test_reduce_lr_on_plateau_matches_pytorch(torch):
    losses = [1.0, 0.9, 0.95, 0.92, 0.91, 0.9, 0.9, 0.89, 0.95, 0.99, 1.0, 0.5, 0.6, 0.6,
              0.6, 0.6, 0.6, 0.6, 0.6, 0.6] * 5
    for options in ({"factor": 0.5, "patience": 2},
                    {"mode": "max", "factor": 0.3, "patience": 1, "cooldown": 2,
                     "threshold_mode": "abs", "threshold": 0.01, "min_lr": [0.01, 0.005]}):
        ours_opt, theirs_opt = _optimizers(torch)
        ours = eo.ReduceLROnPlateau(ours_opt, **options)
        theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(theirs_opt, **options)
        for loss in losses:
            ours.step(loss)
            theirs.step(loss)
            assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)
        assert ours.get_last_lr() != [*LRS]  # it did reduce


def test_scheduler_errors():
    opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
    with pytest.raises(eo.EveryOError, match="initial_lr"):
        eo.StepLR(opt, step_size=2, last_epoch=3)
    with pytest.raises(eo.EveryOError, match="2 values"):
        eo.LambdaLR(opt, [lambda e: 1.0, lambda e: 1.0])
    with pytest.raises(eo.EveryOError, match="milestones"):
        eo.SequentialLR(opt, [eo.ExponentialLR(opt, 0.9)], milestones=[3])
    with pytest.raises(eo.EveryOError, match="total_steps is 3"):
        sched = eo.OneCycleLR(opt, max_lr=1.0, total_steps=3, cycle_momentum=False)
        for _ in range(4):
            sched.step()
    with pytest.raises(eo.EveryOError, match="neither momentum nor betas"):
        eo.OneCycleLR(_NoMomentum(), max_lr=1.0, total_steps=3)
    assert math.isfinite(opt.lr)


class _NoMomentum:
    param_groups = [{"lr": 0.1}]
    defaults = {"lr": 0.1}


@pytest.mark.parametrize("make, message", [
    (lambda o: eo.StepLR(o, step_size="2"), "StepLR: step_size must be a positive int"),
    (lambda o: eo.StepLR(o, step_size=1.5), "StepLR: step_size must be a positive int"),
    (lambda o: eo.StepLR(o, step_size=2, gamma="x"), "StepLR: gamma"),
    (lambda o: eo.StepLR(o, 2, last_epoch="a"), "StepLR: last_epoch must be an int"),
    (lambda o: eo.StepLR(o, 2, last_epoch=-2), "StepLR: last_epoch must be -1"),
    (lambda o: eo.MultiStepLR(o, milestones=5), "MultiStepLR: milestones must be a list"),
    (lambda o: eo.MultiStepLR(o, milestones=[2, 2.5]), "MultiStepLR: milestones must be"),
    (lambda o: eo.LinearLR(o, start_factor="a"), "LinearLR: start_factor"),
    (lambda o: eo.LinearLR(o, start_factor=0), r"LinearLR: start_factor must be a number in \(0, 1\]"),
    (lambda o: eo.LinearLR(o, total_iters=0), "LinearLR: total_iters must be a positive int"),
    (lambda o: eo.ExponentialLR(o, gamma=None), "ExponentialLR: gamma"),
    (lambda o: eo.CosineAnnealingLR(o, T_max="3"), "CosineAnnealingLR: T_max"),
    (lambda o: eo.CosineAnnealingLR(o, T_max=3, eta_min="a"), "CosineAnnealingLR: eta_min"),
    (lambda o: eo.CosineAnnealingWarmRestarts(o, T_0=2.0), "T_0 must be a positive int"),
    (lambda o: eo.CosineAnnealingWarmRestarts(o, T_0=2).step("a"), "epoch must be a finite"),
    (lambda o: eo.LambdaLR(o, 3), "LambdaLR: lr_lambda must be a function"),
    (lambda o: eo.MultiplicativeLR(o, None), "MultiplicativeLR: lr_lambda must be a function"),
    (lambda o: eo.OneCycleLR(o, max_lr="a", total_steps=10), "OneCycleLR: max_lr"),
    (lambda o: eo.OneCycleLR(o, max_lr=1, total_steps=10, div_factor=0), "div_factor"),
    (lambda o: eo.OneCycleLR(o, max_lr=1, epochs=2.5, steps_per_epoch=3), "epochs"),
    (lambda o: eo.SequentialLR(o, [eo.StepLR(o, 2), eo.StepLR(o, 2)], milestones="a"),
     "SequentialLR: milestones must be a list"),
    (lambda o: eo.SequentialLR(o, [eo.StepLR(o, 2)] * 3, milestones=[5, 2]),
     "SequentialLR: milestones must increase"),
    (lambda o: eo.ReduceLROnPlateau(o, patience="a"), "ReduceLROnPlateau: patience"),
    (lambda o: eo.ReduceLROnPlateau(o, factor="a"), "ReduceLROnPlateau: factor"),
    (lambda o: eo.ReduceLROnPlateau(o).step("abc"), "metrics must be one number"),
    (lambda o: eo.ReduceLROnPlateau(None), "NoneType is not an optimizer"),
])
def test_bad_scheduler_arguments_are_named(make, message):
    """Wrong types and ranges raise an EveryOError naming the scheduler and the argument (a
    TypeError too, as PyTorch's argument errors are), never a raw exception later on."""
    opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
    with pytest.raises(eo.EveryOError, match=message):
        make(opt)
    assert opt.lr == 1.0 or math.isfinite(opt.lr)


def test_multistep_resumes_from_its_closed_form(tmp_path):
    opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
    sched = eo.MultiStepLR(opt, milestones=[2, 4, 4], gamma=0.5)
    for _ in range(5):
        sched.step()
    assert opt.lr == 1.0 * 0.5 ** 3
    resumed_opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
    resumed_opt.load_state_dict(opt.state_dict())
    resumed = eo.MultiStepLR(resumed_opt, milestones=[2, 4, 4], gamma=0.5, last_epoch=4)
    assert resumed.get_last_lr() == sched.get_last_lr()


@pytest.mark.parametrize("milestones", [range(3, 12, 4), np.array([3, 7, 7]), {7, 3}])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_milestones_may_be_any_iterable_of_epochs_as_in_pytorch(milestones, torch):
    ours_opt, theirs_opt = _optimizers(torch)
    ours = eo.MultiStepLR(ours_opt, milestones, gamma=0.5)
    theirs = torch.optim.lr_scheduler.MultiStepLR(theirs_opt, milestones, gamma=0.5)
    np.testing.assert_array_equal(_run(ours_opt, ours, 15)[0], _run(theirs_opt, theirs, 15)[0])
    ours_opt, theirs_opt = _optimizers(torch)
    ours = eo.SequentialLR(ours_opt, [eo.ExponentialLR(ours_opt, 0.9), eo.StepLR(ours_opt, 2)],
                           milestones=np.array([4]))
    schedulers = torch.optim.lr_scheduler
    theirs = schedulers.SequentialLR(
        theirs_opt, [schedulers.ExponentialLR(theirs_opt, 0.9), schedulers.StepLR(theirs_opt, 2)],
        milestones=np.array([4]))
    np.testing.assert_array_equal(_run(ours_opt, ours, 10)[0], _run(theirs_opt, theirs, 10)[0])
