"""rmsprop_tf against a numpy transcription of timm's RMSpropTF.step (alpha 0.9, eps 1e-3, momentum 0.9)."""
import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.optim import build_optimizer
from ppdlx.optim.rmsprop_tf import RMSpropTF

LRS = [0.1, 0.1, 0.05, 0.02, 0.02, 0.01]  # lr changes between steps: tests "lr inside the momentum buffer"


def timm_rmsprop_tf(params, grads_per_step, lrs, wds, alpha=0.9, eps=1e-3, momentum=0.9):
    """timm.optim.RMSpropTF.step, decoupled_decay=False, lr_in_momentum=True, centered=False."""
    params = [p.astype(np.float64).copy() for p in params]
    square_avg = [np.ones_like(p) for p in params]   # TF init: ones
    buf = [np.zeros_like(p) for p in params]
    for grads, lr in zip(grads_per_step, lrs):
        for i, (p, g) in enumerate(zip(params, grads)):
            g = g + wds[i] * p                                  # L2, coupled
            square_avg[i] += (1.0 - alpha) * (g * g - square_avg[i])
            avg = np.sqrt(square_avg[i] + eps)                  # eps inside sqrt
            buf[i] = momentum * buf[i] + lr * g / avg           # lr inside the buffer
            p -= buf[i]
    return params


class Tiny(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(6, 5)      # weight decays, bias does not
        self.bn = paddle.nn.BatchNorm1D(5)    # 1-D scale/shift: no decay


def _run(opt_factory, grads_per_step, model):
    params = [p for p in model.parameters() if not p.stop_gradient]
    sched = paddle.optimizer.lr.PiecewiseDecay(list(range(1, len(LRS))), LRS)
    opt = opt_factory(sched, model)
    for grads in grads_per_step:
        loss = sum((p * paddle.to_tensor(g)).sum() for p, g in zip(params, grads))
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
    return [p.numpy() for p in params], opt


def _setup(seed=0):
    paddle.seed(seed)
    model = Tiny()
    rng = np.random.default_rng(seed)
    params = [p for p in model.parameters() if not p.stop_gradient]
    init = [p.numpy().copy() for p in params]
    # gradients of very different scales, as in a real network
    grads = [[(rng.standard_normal(p.shape) * s).astype(np.float32) for p, s in zip(params, (3.0, 0.01, 1.0, 0.1))]
             for _ in LRS]
    return model, params, init, grads


def _cfg(**over):
    return load_config(None, ["optimizer.name=rmsprop_tf", "optimizer.momentum=0.9", "optimizer.rho=0.9",
                              "optimizer.epsilon=0.001", "optimizer.weight_decay=0.01", *[f"{k}={v}" for k, v in over.items()]])


def test_matches_timm_rmsprop_tf_reference():
    model, params, init, grads = _setup()
    cfg = _cfg()
    got, opt = _run(lambda sched, m: build_optimizer(cfg, m, sched), grads, model)
    assert isinstance(opt, RMSpropTF)
    names = [n for n, p in model.named_parameters()]
    wds = [0.01 if len(p.shape) > 1 else 0.0 for p in params]  # ppdlx.optim.param_groups: no decay on 1-D
    assert wds == [0.01, 0.0, 0.0, 0.0], names
    ref = timm_rmsprop_tf(init, grads, LRS, wds)
    moved = max(float(np.abs(r - i).max()) for r, i in zip(ref, init))
    assert moved > 0.1  # the reference really moves the weights
    err = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    assert err < 2e-6, err


def test_stock_paddle_rmsprop_differs_only_by_the_mean_square_init():
    model, params, init, grads = _setup()
    wds = [0.0] * 4
    got, _ = _run(lambda sched, m: paddle.optimizer.RMSProp(sched, rho=0.9, epsilon=1e-3, momentum=0.9,
                                                             parameters=m.parameters()), grads[:1], model)
    ref_ones = timm_rmsprop_tf(init, grads[:1], LRS, wds)
    # paddle starts the mean square at 0: first update ~ lr * g / sqrt(0.1 g^2 + eps) ~ 3 lr, not ~ lr
    step_paddle = np.abs(got[0] - init[0]).mean()
    step_tf = np.abs(ref_ones[0] - init[0]).mean()
    assert step_paddle > 2.0 * step_tf, (step_paddle, step_tf)


def test_resume_from_state_dict_continues_identically():
    model, params, init, grads = _setup(1)
    cfg = _cfg()
    straight, _ = _run(lambda s, m: build_optimizer(cfg, m, s), grads, model)

    model2, params2, _, _ = _setup(1)
    sched = paddle.optimizer.lr.PiecewiseDecay(list(range(1, len(LRS))), LRS)
    # accumulator names come from paddle's unique_name counter: a fresh process (a real resume)
    # starts it from 0; here each optimizer gets its own counter
    with paddle.utils.unique_name.guard():
        opt = build_optimizer(cfg, model2, sched)
        for grads_t in grads[:3]:
            sum((p * paddle.to_tensor(g)).sum() for p, g in zip(params2, grads_t)).backward()
            opt.step(); opt.clear_grad(); sched.step()
    opt_state, sched_state = opt.state_dict(), sched.state_dict()
    ms = [v for k, v in opt_state.items() if "mean_square" in k]
    assert len(ms) == 4 and all(float(np.asarray(v).min()) > 0.5 for v in ms)  # started at 1, decays slowly
    sched2 = paddle.optimizer.lr.PiecewiseDecay(list(range(1, len(LRS))), LRS)
    sched2.set_state_dict(sched_state)
    with paddle.utils.unique_name.guard():
        opt2 = build_optimizer(cfg, model2, sched2)
        opt2.set_state_dict(opt_state)
        for grads_t in grads[3:]:
            sum((p * paddle.to_tensor(g)).sum() for p, g in zip(params2, grads_t)).backward()
            opt2.step(); opt2.clear_grad(); sched2.step()
    assert max(float(np.abs(a - b.numpy()).max()) for a, b in zip(straight, params2)) == 0.0


@pytest.mark.parametrize("spe", [5, 7])
def test_step_schedule_is_timm_step_lr_per_step(spe):
    """lr.name=step: warm-up from warmup_start_lr, then peak * 0.97 ** floor(step / (2.4 * spe)) from step 0."""
    from ppdlx.optim import build_lr_schedule
    cfg = load_config(None, ["lr.name=step", "lr.base_lr=0.06", "lr.scale_with_batch=false", "lr.warmup_epochs=3",
                             "lr.warmup_start_lr=1e-6", "lr.decay_epochs=2.4", "lr.decay_rate=0.97",
                             "train.epochs=20"])
    sched = build_lr_schedule(cfg, global_batch=1536, steps_per_epoch=spe)
    lrs = []
    for _ in range(20 * spe):
        lrs.append(sched())
        sched.step()
    warm = 3 * spe
    assert lrs[0] == pytest.approx(1e-6)
    assert lrs[warm // 2] == pytest.approx(1e-6 + (0.06 - 1e-6) * (warm // 2) / warm)
    for s in range(warm, 20 * spe):
        assert lrs[s] == pytest.approx(0.06 * 0.97 ** int(s / (2.4 * spe) + 1e-9), rel=1e-9), s
    # at whole epochs this is timm's StepLRScheduler(decay_t=2.4, decay_rate=0.97, warmup_t=3)
    for epoch in range(3, 20):
        assert lrs[epoch * spe] == pytest.approx(0.06 * 0.97 ** (epoch // 2.4), rel=1e-9), epoch
    assert lrs[3 * spe] == pytest.approx(0.06 * 0.97)  # already decayed once at the end of warm-up
    # resume: a fresh schedule with the saved state continues identically
    state = sched.state_dict()
    again = build_lr_schedule(cfg, global_batch=1536, steps_per_epoch=spe)
    again.set_state_dict(state)
    assert again() == pytest.approx(sched())
