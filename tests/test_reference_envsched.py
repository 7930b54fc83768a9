"""Tests of the plain NumPy reference EnvSched (tests/reference_envsched.py).

The four-node scenario (FOUR_NODE_SCENARIO / FOUR_NODE_EXPECTED / run_four_node /
assert_four_node_details) is written so that another implementation can be checked against the
same hand-computed numbers:

    from test_reference_envsched import run_four_node, assert_four_node_details
    assert_four_node_details(run_four_node(lambda s_full, s_abs, env: MyImpl(s_full, s_abs, env)))
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from reference_envsched import (
    RefConfig,
    ReferenceEnvSched,
    ReferenceInfeasible,
    fit_ridge,
    observation_stats,
    percentile_rank,
)

ABS = 1e-9

# =============================================================================================
# 1. Four-node scenario, every equation by hand
# =============================================================================================
# Nodes 0, 1 in environment 0; nodes 2, 3 in environment 1. Nodes 2 and 3 are never observed and
# are symmetric (same similarities to 0 and 1 in both matrices), so their scores tie exactly.
FOUR_NODE_SCENARIO = {
    "s_full": np.array(
        [
            [1.00, 0.97, 0.20, 0.20],
            [0.97, 1.00, 0.30, 0.30],
            [0.20, 0.30, 1.00, 0.50],
            [0.20, 0.30, 0.50, 1.00],
        ]
    ),
    "s_abs": np.array(
        [
            [1.0, 0.8, 0.4, 0.4],
            [0.8, 1.0, 0.7, 0.7],
            [0.4, 0.7, 1.0, 0.9],
            [0.4, 0.7, 0.9, 1.0],
        ]
    ),
    "env_index": np.array([0, 0, 1, 1]),
    # (step, nodes, rewards [len(nodes), K = 4])
    "observations": [
        (0, [0, 1], np.array([[0.75, 0.75, 0.75, 0.75], [1.0, 0.5, 0.25, 0.0]])),
        (1, [0, 1], np.array([[0.75, 0.5, 0.0, 0.0], [0.25, 0.0, 0.0, 0.0]])),
    ],
    "t": 2,
}

# ---- observation statistics (v, m, d), K = 4 -------------------------------------------------
# node 0, step 0: r = (.75,.75,.75,.75): m = .75, v = 0, d = 0 / max(.75*.25, .01) = 0
# node 1, step 0: r = (1,.5,.25,0): m = 1.75/4 = .4375; deviations (.5625,.0625,-.1875,-.4375),
#   squares (.31640625,.00390625,.03515625,.19140625), sum .546875 -> v = .13671875 = 35/256;
#   m(1-m) = .4375*.5625 = .24609375 = 63/256 -> d = 35/63 = 5/9 = .555556
# node 0, step 1: r = (.75,.5,0,0): m = 1.25/4 = .3125 = 5/16; deviations (.4375,.1875,-.3125,-.3125),
#   squares (.19140625,.03515625,.09765625,.09765625), sum .421875 -> v = .10546875 = 27/256;
#   m(1-m) = (5/16)(11/16) = 55/256 -> d = 27/55 = .490909
# node 1, step 1: r = (.25,0,0,0): m = 1/16 = .0625; v = (.1875^2 + 3*.0625^2)/4 = .046875/4
#   = .01171875 = 3/256; m(1-m) = 15/256 -> d = 3/15 = .2
_Y = {  # (node, step) -> (v, m, d)
    (0, 0): (0.0, 0.75, 0.0),
    (1, 0): (35 / 256, 0.4375, 5 / 9),
    (0, 1): (27 / 256, 5 / 16, 27 / 55),
    (1, 1): (3 / 256, 1 / 16, 1 / 5),
}
# step means b[s] (v, m, d) over the two nodes observed at s:
# b[0] = ((0 + 35/256)/2, (.75 + .4375)/2, (0 + 5/9)/2) = (.068359375, .59375, .277778)
# b[1] = ((27 + 3)/512, (5/16 + 1/16)/2, (27/55 + 11/55)/2) = (.05859375, .1875, .345455)
_B = {0: (35 / 512, 0.59375, 5 / 18), 1: (30 / 512, 3 / 16, 19 / 55)}
_HI = (0.25, 1.0, 1.0)  # I_v = [0, .25], I_m = I_d = [0, 1]

# ---- neighbours at t = 2 (observed nodes: 0 and 1; 2 and 3 never observed) -------------------
# N_in(0) = [1], N_in(1) = [0]; N_in(2) = N_in(3) = [] (their env mate is unobserved).
# N_cross(0) = N_cross(1) = [] (nodes of env 1 unobserved);
# N_cross(2) = N_cross(3) = [1, 0]: S_abs[2,1] = .7 > S_abs[2,0] = .4 (decreasing similarity).
# sigma_in[0] = sigma_in[1] = max(median(1 - .97 = .03), .05) = .05 (the floor); sigma_in[2,3] =
# .05 (no neighbour). sigma_cross[0,1] = .05 (no neighbour); sigma_cross[2] = sigma_cross[3] =
# max(median(1 - .7, 1 - .4) = (.3 + .6)/2 = .45, .05) = .45.
_NBR_IN = np.full((4, 6), -1)
_NBR_IN[0, 0], _NBR_IN[1, 0] = 1, 0
_NBR_CROSS = np.full((4, 12), -1)
_NBR_CROSS[2, :2] = [1, 0]
_NBR_CROSS[3, :2] = [1, 0]


def _expected_for_half_life(h: float) -> dict:
    """Everything per half-life, written out scalar by scalar. Comments: h = 8 | h = 2."""
    # w(h)[2,0] = 2^(-2/h): .840896 | .5;  w(h)[2,1] = 2^(-1/h): .917004 | .707107
    w0, w1 = 2 ** (-2 / h), 2 ** (-1 / h)
    # bhat[y] = (w0 b[y,0] + w1 b[y,1]) / (w0 + w1), w0 + w1 = 1.757900 | 1.207107
    #   v: (.840896*.068359 + .917004*.058594)/1.757900 = .0632652 | (.5*.068359 + .707107*.058594)/1.207107 = .0626388
    #   m: (.840896*.59375 + .917004*.1875)/1.757900 = .381831   | .355774
    #   d: (.840896*.277778 + .917004*.345455)/1.757900 = .313081 | .317422
    bhat = [(w0 * _B[0][k] + w1 * _B[1][k]) / (w0 + w1) for k in range(3)]
    # centred ytilde = clip(y - b[s] + bhat):
    #   node 0, step 0: v: 0 - .068359 + .063265 = -.005094 -> CLIPPED to 0 (h=2: -.005721 -> 0)
    #                   m: .75 - .59375 + .381831 = .538081 | .512024
    #                   d: 0 - .277778 + .313081 = .035303 | .039644
    #   node 1, step 0: v: .136719 - .068359 + .063265 = .131625 | .130998
    #                   m: .4375 - .59375 + .381831 = .225581 | .199524
    #                   d: .555556 - .277778 + .313081 = .590859 | .595200
    #   node 0, step 1: v: .105469 - .058594 + .063265 = .110140 | .109514
    #                   m: .3125 - .1875 + .381831 = .506831 | .480774
    #                   d: .490909 - .345455 + .313081 = .458536 | .462876
    #   node 1, step 1: v: .011719 - .058594 + .063265 = .016390 | .015764
    #                   m: .0625 - .1875 + .381831 = .256831 | .230774
    #                   d: .2 - .345455 + .313081 = .167627 | .171967
    yt = {}
    for (i, s), y in _Y.items():
        yt[i, s] = [min(max(y[k] - _B[s][k] + bhat[k], 0.0), _HI[k]) for k in range(3)]
    # W[0] = W[1] = w0 + w1 = 1.757900 | 1.207107; W[2] = W[3] = 0
    W = w0 + w1
    # ybar[i] = (w0 yt[i,0] + w1 yt[i,1]) / W:
    #   node 0: v (.840896*0 + .917004*.110140)/1.7579 = .0574543 | .0641517
    #           m .521779 | .493718;  d .256081 | .287568
    #   node 1: v .0715128 | .0634954;  m .241882 | .217830;  d .370081 | .347276
    #   nodes 2, 3 (no history): bhat
    ybar = {i: [(w0 * yt[i, 0][k] + w1 * yt[i, 1][k]) / W for k in range(3)] for i in (0, 1)}
    ybar[2] = ybar[3] = bhat
    # a_in[0,1] = exp(-.5 (.03/.05)^2) clip(W[1], .1, 3) = exp(-.18) * 1.757900 = .835270*1.757900
    #   = 1.468322 | .835270*1.207107 = 1.008260;  a_in[1,0] = the same (W[0] = W[1])
    a_in = math.exp(-0.5 * ((1 - 0.97) / 0.05) ** 2) * W
    # G_in[0] = (a ybar[1] + 2 bhat)/(a + 2): v (1.468322*.071513 + 2*.063265)/3.468322 = .0667568 | .0629259
    #   m .322583 | .309540;  d .337212 | .327428
    # G_in[1] = (a ybar[0] + 2 bhat)/(a + 2): v .0608051 | .0631459;  m .441078 | .402008;  d .288950 | .307416
    # G_in[2] = G_in[3] = bhat (no neighbour)
    g_in0 = [(a_in * ybar[1][k] + 2 * bhat[k]) / (a_in + 2) for k in range(3)]
    g_in1 = [(a_in * ybar[0][k] + 2 * bhat[k]) / (a_in + 2) for k in range(3)]
    # a_cross[2,1] = exp(-.5 (.3/.45)^2) W[1] = exp(-2/9)*1.757900 = .800737*1.757900 = 1.407617 | .966576
    # a_cross[2,0] = exp(-.5 (.6/.45)^2) W[0] = exp(-8/9)*1.757900 = .411112*1.757900 = .722694 | .496256
    a21 = math.exp(-0.5 * ((1 - 0.7) / 0.45) ** 2) * W
    a20 = math.exp(-0.5 * ((1 - 0.4) / 0.45) ** 2) * W
    # G_cross[2] = G_cross[3] = (a21 ybar[1] + a20 ybar[0] + 2 bhat)/(a21 + a20 + 2)
    #   v (1.407617*.071513 + .722694*.057454 + 2*.063265)/4.130311 = .0650592 | .0630947
    #   m .358623 | .337039;  d .322533 | .321477
    # G_cross[0] = G_cross[1] = bhat (no neighbour)
    g_cross2 = [(a21 * ybar[1][k] + a20 * ybar[0][k] + 2 * bhat[k]) / (a21 + a20 + 2) for k in range(3)]
    G_in = [g_in0, g_in1, bhat, bhat]
    G_cross = [bhat, bhat, g_cross2, g_cross2]
    # P = .5 G_in + .5 G_cross:
    #   node 0: v .0650110 | .0627824;  m .352207 | .332657;  d .325147 | .322425
    #   node 1: v .0620351 | .0628923;  m .411455 | .378891;  d .301016 | .312419
    #   nodes 2, 3: v .0641622 | .0628668;  m .370227 | .346407;  d .317807 | .319449
    P = [[0.5 * G_in[i][k] + 0.5 * G_cross[i][k] for k in range(3)] for i in range(4)]
    # yhat = (W ybar + 2 P)/(W + 2); for nodes 2, 3 (W = 0): yhat = P
    #   node 0: v (1.7579*.057454 + 2*.065011)/3.7579 = .0614761 | .0632978;  m .431531 | .393278;  d .292839 | .309305
    #   node 1: v .0664687 | .0631193;  m .332131 | .318270;  d .333324 | .325539
    Ws = [W, W, 0.0, 0.0]
    yhat = [[(Ws[i] * ybar[i][k] + 2 * P[i][k]) / (Ws[i] + 2) for k in range(3)] for i in range(4)]
    # f = dhat mhat (1 - mhat):
    #   node 0: .292839*.431531*.568469 = .0718369 | .309305*.393278*.606722 = .0738035
    #   node 1: .0739378 | .0706335;  nodes 2, 3: .0740996 | .0723262
    f = [yhat[i][2] * yhat[i][1] * (1 - yhat[i][1]) for i in range(4)]
    vh = [yhat[i][0] for i in range(4)]
    if h == 8.0:
        # vhat = (.0614761, .0664687, .0641622, .0641622): ranks (1, 4, 2.5, 2.5) [tie]
        #   -> pr = ((1-.5)/4, (4-.5)/4, (2.5-.5)/4, ...) = (.125, .875, .5, .5)
        # f = (.0718369, .0739378, .0740996, .0740996): ranks (1, 2, 3.5, 3.5) -> pr (.125, .375, .75, .75)
        # p = .65 pr(v) + .35 pr(f) = (.125, .56875 + .13125 = .7, .325 + .2625 = .5875, .5875)
        # sorted vhat = (v0, v2, v3 = v2, v1); position p*(N-1) = 3p:
        #   node 0: 3*.125 = .375  -> v0 + .375 (v2 - v0) = .0614761 + .375*.0026861 = .0624834
        #   node 1: 3*.7 = 2.1     -> v2 + .1 (v1 - v2) = .0641622 + .1*.0023065 = .0643929
        #   node 2, 3: 3*.5875 = 1.7625 -> between sorted[1] = v2 and sorted[2] = v2: v2 = .0641622
        u_h = [vh[0] + 0.375 * (vh[2] - vh[0]), vh[2] + 0.1 * (vh[1] - vh[2]), vh[2], vh[2]]
    else:
        # vhat = (.0632978, .0631193, .0628668, .0628668): ranks (4, 3, 1.5, 1.5) -> pr (.875, .625, .25, .25)
        # f = (.0738035, .0706335, .0723262, .0723262): ranks (4, 1, 2.5, 2.5) -> pr (.875, .125, .5, .5)
        # p = (.875, .40625 + .04375 = .45, .1625 + .175 = .3375, .3375)
        # sorted vhat = (v2, v3 = v2, v1, v0); position 3p:
        #   node 0: 2.625  -> v1 + .625 (v0 - v1) = .0631193 + .625*.0001784 = .0632309
        #   node 1: 1.35   -> v2 + .35 (v1 - v2) = .0628668 + .35*.0002526 = .0629552
        #   node 2, 3: 1.0125 -> v2 + .0125 (v1 - v2) = .0628699
        u_h = [vh[1] + 0.625 * (vh[0] - vh[1]), vh[2] + 0.35 * (vh[1] - vh[2]),
               vh[2] + 0.0125 * (vh[1] - vh[2]), vh[2] + 0.0125 * (vh[1] - vh[2])]  # fmt: skip
    return {
        "bhat": bhat, "W": Ws, "ybar": [ybar[i] for i in range(4)], "G_in": G_in,
        "G_cross": G_cross, "P": P, "yhat": yhat, "f": f, "u_h": u_h,
    }  # fmt: skip


def _build_four_node_expected() -> dict:
    per_h = {h: _expected_for_half_life(h) for h in (8.0, 2.0)}
    exp = {key: {h: np.array(per_h[h][key], dtype=np.float64) for h in per_h} for key in per_h[8.0]}
    u8, u2 = exp["u_h"][8.0], exp["u_h"][2.0]
    # decline: u = u8 - .5 max(u8 - u2, 0):
    #   node 0: u8 = .0624834 < u2 = .0632309 -> no decline, u = .0624834
    #   node 1: u8 = .0643929 > u2 = .0629552 -> u = u8 - .5 (u8 - u2) = (u8 + u2)/2 = .0636740
    #   nodes 2, 3: u8 = .0641622 > u2 = .0628699 -> u = (u8 + u2)/2 = .0635161
    u = np.array([u8[0], (u8[1] + u2[1]) / 2, (u8[2] + u2[2]) / 2, (u8[3] + u2[3]) / 2])
    exp["u"] = u
    # q = pr(u): u = (.0624834, .0636740, .0635161, .0635161): ranks (1, 4, 2.5, 2.5)
    #   -> q = (.125, .875, .5, .5)
    exp["q"] = np.array([0.125, 0.875, 0.5, 0.5])
    exp["nbr_in"] = _NBR_IN
    exp["nbr_cross"] = _NBR_CROSS
    exp["sigma_in"] = np.array([0.05, 0.05, 0.05, 0.05])
    exp["sigma_cross"] = np.array([0.05, 0.05, 0.45, 0.45])
    # progress filter: usable transitions are node 0 (step 0 -> 1) and node 1 (step 0 -> 1): 2 in
    # the pool, so the ridge is fitted. Features x = (m1, m1^2, v1, s1, n1):
    #   node 0: (.75, .5625, 0, 0, 1) -> y = .3125;  node 1: (.4375, .19140625, 35/256, 0, 1) -> y = .0625
    # standardised: m1 -> (+1, -1), m1^2 -> (+1, -1), v1 -> (-1, +1), s1 and n1 constant -> 0;
    # onehot(env 0) = (1, 1), onehot(env 1) = (0, 0). Centered target: ybar = .1875, (+.125, -.125).
    # With a = (1, 1, -1): D^T D = 2 a a^T (+ the env block, orthogonal to the target), D^T y = .25 a
    #   -> beta = c a with (2*3 + 1) c = .25, c = 1/28; gamma = 0; fitted = +-3c = +-3/28.
    # residuals: node 0: .125 - 3/28 = 1/56;  node 1: -1/56.  R_env(0) = 0, R_env(1) = 0.
    # R_nb(0) = rbar[1] = -1/56 (N_in(0) = [1]); est_0 = (1*(1/56) + 2*(.5*0 + .5*(-1/56)))/3 = 0
    # est_1 = (-1/56 + 2*(.5*(1/56)))/3 = 0;  nodes 2, 3: n = 0, R_env(1) = 0,
    # R_nb = mean(rbar[1], rbar[0]) = 0 -> est = 0. Nobody has 3 transitions: nobody excluded.
    exp["progress_n"] = np.array([1, 1, 0, 0])
    exp["progress_est"] = np.zeros(4)
    exp["progress_excluded"] = np.zeros(4, dtype=bool)
    # The above is progress_fit="in_sample". Under the paper's rule (earlier_steps, the default)
    # both transitions end at step 1 and no earlier step has a transition to fit on: nothing is
    # scored, so progress_n = 0 everywhere and est = 0 (FOUR_NODE_PROGRESS_N below).
    return exp


FOUR_NODE_EXPECTED = _build_four_node_expected()
FOUR_NODE_PROGRESS_N = {"in_sample": np.array([1, 1, 0, 0]), "earlier_steps": np.zeros(4, np.int64)}
_H_KEYS = ("bhat", "W", "ybar", "G_in", "G_cross", "P", "yhat", "f", "u_h")


def run_four_node(impl_factory) -> dict:
    """impl_factory(s_full, s_abs, env_index) -> object with observe(t, nodes, rewards), details(t)."""
    sc = FOUR_NODE_SCENARIO
    impl = impl_factory(sc["s_full"].copy(), sc["s_abs"].copy(), sc["env_index"].copy())
    for step, nodes, rewards in sc["observations"]:
        impl.observe(step, list(nodes), rewards.copy())
    return impl.details(sc["t"])


def assert_four_node_details(got: dict, progress_fit: str = "in_sample") -> None:
    exp = dict(FOUR_NODE_EXPECTED, progress_n=FOUR_NODE_PROGRESS_N[progress_fit])
    for key in _H_KEYS:
        for h in (8.0, 2.0):
            np.testing.assert_allclose(
                np.asarray(got[key][h], dtype=np.float64), exp[key][h], rtol=0, atol=ABS,
                err_msg=f"{key}[h={h}]",
            )  # fmt: skip
    for key in ("u", "q", "sigma_in", "sigma_cross", "progress_est"):
        np.testing.assert_allclose(
            np.asarray(got[key], dtype=np.float64), exp[key], rtol=0, atol=ABS, err_msg=key
        )
    for key in ("nbr_in", "nbr_cross", "progress_n", "progress_excluded"):
        np.testing.assert_array_equal(np.asarray(got[key]), exp[key], err_msg=key)


def test_four_node_observation_statistics():
    for (i, s), (v, m, d) in _Y.items():
        _, nodes, rewards = FOUR_NODE_SCENARIO["observations"][s]
        got_m, got_v, got_d = observation_stats(rewards[nodes.index(i)])
        assert (got_v, got_m, got_d) == pytest.approx((v, m, d), abs=ABS)
    # d's floor: m = 0 -> v / max(0, .01) = 0
    assert observation_stats(np.zeros(4)) == pytest.approx((0.0, 0.0, 0.0), abs=ABS)


def test_four_node_step_means_and_weights():
    ref = ReferenceEnvSched(
        FOUR_NODE_SCENARIO["s_full"], FOUR_NODE_SCENARIO["s_abs"], FOUR_NODE_SCENARIO["env_index"]
    )
    for step, nodes, rewards in FOUR_NODE_SCENARIO["observations"]:
        ref.observe(step, nodes, rewards)
    for s in (0, 1):
        assert list(ref.step_means[s]) == pytest.approx(list(_B[s]), abs=ABS)
    d = ref.details(2)
    assert d["W"][8.0][0] == pytest.approx(0.8408964152537145 + 0.9170040432046712, abs=ABS)
    assert d["W"][2.0][1] == pytest.approx(0.5 + 0.7071067811865476, abs=ABS)


@pytest.mark.parametrize("progress_fit", ["in_sample", "earlier_steps"])
def test_four_node_all_quantities(progress_fit):
    config = RefConfig(progress_fit=progress_fit)
    assert_four_node_details(run_four_node(lambda s_full, s_abs, env: ReferenceEnvSched(s_full, s_abs, env, config)),
                             progress_fit)


def test_four_node_spot_values():
    """A few literal numbers, so that the hand-derived formulas above cannot drift silently."""
    exp = FOUR_NODE_EXPECTED
    assert exp["bhat"][8.0] == pytest.approx([0.06326516300049126, 0.3818307808204366, 0.3130811815012419], abs=ABS)
    assert exp["ybar"][8.0][0, 0] == pytest.approx(0.9170040432046712 * 0.11014016300049126 / 1.7579004584583857, abs=ABS)
    assert exp["yhat"][8.0][1] == pytest.approx([0.06646869522576306, 0.3321306755808054, 0.33332358780169524], abs=ABS)
    assert exp["u"] == pytest.approx([0.06248337, 0.06367401, 0.06351606, 0.06351606], abs=1e-8)


# =============================================================================================
# Helpers shared by the remaining tests
# =============================================================================================
def _random_scenario(rng, n, n_env, excluded_frac=0.0):
    env = np.concatenate([np.arange(n_env), rng.integers(0, n_env, size=n - n_env)])
    rng.shuffle(env)
    a = rng.uniform(0, 1, size=(n, n))
    s_full = (a + a.T) / 2
    s_full[env[:, None] == env[None, :]] = np.minimum(1, s_full[env[:, None] == env[None, :]] + 0.3)
    np.fill_diagonal(s_full, 1.0)
    b = rng.uniform(0, 1, size=(n, n))
    s_abs = (b + b.T) / 2
    np.fill_diagonal(s_abs, 1.0)
    excluded = [int(i) for i in np.flatnonzero(rng.uniform(size=n) < excluded_frac)]
    return s_full, s_abs, env, excluded


def _rewards(rng, p, nodes, k):
    return (rng.uniform(size=(len(nodes), k)) < p[np.array(nodes)][:, None]).astype(np.float64)


def _representatives(s_full, env, excluded=()):
    reps = []
    for e in range(int(env.max()) + 1):
        members = np.flatnonzero(env == e)
        best, best_val = None, -np.inf
        for i in members:
            if i in excluded:
                continue
            others = [j for j in members if j != i]
            val = np.mean(s_full[i, others]) if others else 0.0
            if val > best_val:
                best, best_val = int(i), val
        if best is not None:
            reps.append(best)
    return reps


def _state_equal(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)
    return a == b


# =============================================================================================
# 2. Progress filter and ridge
# =============================================================================================
def _progress_scenario(progress_fit="in_sample"):
    """Details at t = 7 (the in-sample rule unless ``progress_fit`` says otherwise). Nodes 0 (A), 1 (B) in env 0; nodes 2 (C), 3, 4 in env 1.

    A and B are observed at steps 0, 2, 4, 6 (3 transitions each, never two steps in a row, so
    cap (c) does not block them at t = 7), C at steps 0, 2, 4 (2 transitions), node 4 at steps
    1, 3, 5 with a flat mean .5 (2 transitions), node 3 never. Rewards are constant (v = d = 0).
    """
    env = np.array([0, 0, 1, 1, 1])
    s_full = np.full((5, 5), 0.5)
    np.fill_diagonal(s_full, 1.0)
    s_abs = s_full.copy()
    ref = ReferenceEnvSched(s_full, s_abs, env, RefConfig(batch_size=4, progress_fit=progress_fit))
    means = {
        0: {0: 0.9, 2: 0.7, 4: 0.5, 6: 0.3},  # A: falling
        1: {0: 0.1, 2: 0.3, 4: 0.5, 6: 0.7},  # B: rising
        2: {0: 0.8, 2: 0.5, 4: 0.2},  # C: falling, but only 2 transitions
        4: {1: 0.5, 3: 0.5, 5: 0.5},  # flat
    }
    for t in range(7):
        nodes = [i for i in sorted(means) if t in means[i]]
        ref.observe(t, nodes, np.array([[means[i][t]] * 4 for i in nodes]))
    return ref


def test_progress_filter_small_case():
    ref = _progress_scenario()
    d = ref.details(7)
    assert list(d["progress_n"]) == [3, 3, 2, 0, 2]
    # A's next mean is always .2 below its previous one, B's always .2 above; they share the
    # environment and the features (s1, n1) transition by transition, so the shared fit lies
    # between them: A's residuals are negative, B's positive. C falls too but has only 2
    # transitions, so it is never excluded.
    assert d["progress_est"][0] < 0 < d["progress_est"][1]
    assert list(d["progress_excluded"]) == [True, False, False, False, False]

    # exploitation never picks A although it has the highest q; without the filter it is first
    q = np.array([1.0, 0.2, 0.3, 0.4, 0.5])
    expl = ReferenceEnvSched(ref.s_full, ref.s_abs, ref.env, RefConfig(batch_size=2, rho=0.0, progress_fit="in_sample"))
    expl.__dict__.update({k: copy.deepcopy(v) for k, v in ref.__dict__.items() if k != "config"})
    picks, phases = expl.construct_batch(7, q, d["progress_excluded"])
    assert phases == ["exploitation"] * 2 and 0 not in picks
    assert expl.construct_batch(7, q, np.zeros(5, dtype=bool))[0][0] == 0

    # the est formula, recomputed from the fit's residuals
    fit = ref.progress_fit(7, d["nbr_in"], d["nbr_cross"])
    res, node = fit["residuals"], fit["transition_node"]
    rbar = np.array([res[node == i].mean() if (node == i).any() else 0.0 for i in range(5)])
    r_env0 = res[np.isin(node, [0, 1])].mean()
    # A: N_in(0) = [1], N_cross(0) = [2, 3, 4] of which 2 and 4 have transitions
    r_nb0 = np.mean([rbar[1], rbar[2], rbar[4]])
    est0 = (3 * rbar[0] + 2 * (0.5 * r_env0 + 0.5 * r_nb0)) / (3 + 2)
    assert d["progress_est"][0] == pytest.approx(est0, abs=ABS)


def test_progress_filter_needs_two_transitions():
    env = np.array([0, 0, 1])
    s = np.eye(3) * 0.5 + 0.5
    ref = ReferenceEnvSched(s, s, env, RefConfig(progress_fit="in_sample"))
    ref.observe(0, [0, 1], np.array([[1.0, 1.0], [0.0, 1.0]]))
    ref.observe(1, [0, 2], np.array([[0.0, 0.0], [1.0, 1.0]]))
    d = ref.details(2)
    assert list(d["progress_n"]) == [1, 0, 0]
    assert not d["progress_excluded"].any()
    assert list(d["progress_est"]) == [0.0, 0.0, 0.0]


def test_progress_design_and_ridge_against_sklearn():
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(3)
    s_full, s_abs, env, _ = _random_scenario(rng, 40, 5)
    ref = ReferenceEnvSched(s_full, s_abs, env, RefConfig(batch_size=12, ridge_lambda=1.0, progress_fit="in_sample"))
    p = rng.uniform(size=40)
    for t in range(8):
        nodes = sorted(rng.choice(40, size=12, replace=False).tolist())
        ref.observe(t, nodes, _rewards(rng, p, nodes, 6))
    d = ref.details(8)
    fit = ref.progress_fit(8, d["nbr_in"], d["nbr_cross"])
    design, yc = fit["design"], fit["y_centered"]
    T = design.shape[0]
    assert T >= 20 and design.shape[1] == 5 + 5
    # standardised columns: mean 0, population std 1 (none is constant here); one-hot block
    assert design[:, :5].mean(axis=0) == pytest.approx(np.zeros(5), abs=1e-12)
    assert design[:, :5].std(axis=0) == pytest.approx(np.ones(5), abs=1e-12)
    np.testing.assert_array_equal(design[:, 5:].sum(axis=1), np.ones(T))
    np.testing.assert_array_equal(np.argmax(design[:, 5:], axis=1), env[fit["transition_node"]])
    assert yc.mean() == pytest.approx(0.0, abs=1e-12)
    sk = Ridge(alpha=1.0, fit_intercept=False).fit(design, yc)
    np.testing.assert_allclose(fit["coef"], sk.coef_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(fit["residuals"], fit["y"] - fit["y_mean"] - sk.predict(design), atol=1e-9)
    # n1 counts usable observations oldest first; s1 is the absolute step
    for r in range(T):
        i = fit["transition_node"][r]
        obs = ref.usable(i, 8)
        k = int(fit["X"][r, 4]) - 1
        assert obs[k].step == fit["X"][r, 3]
        assert obs[k + 1].m == fit["y"][r]


def test_progress_earlier_steps_scores_each_step_by_a_fit_on_earlier_steps_only():
    """The paper's rule (appendix C), checked against scikit-learn's Ridge: the transitions of
    step s are residuals of a fit on the transitions of steps < s only (standardised and centred
    on those); steps with fewer than two earlier transitions are not scored."""
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(4)
    s_full, s_abs, env, _ = _random_scenario(rng, 40, 5)
    ref = ReferenceEnvSched(s_full, s_abs, env, RefConfig(batch_size=12, ridge_lambda=1.0))
    assert ref.config.progress_fit == "earlier_steps"   # the default
    p = rng.uniform(size=40)
    for t in range(9):
        nodes = sorted(rng.choice(40, size=12, replace=False).tolist())
        ref.observe(t, nodes, _rewards(rng, p, nodes, 6))
    d = ref.details(9)
    fit = ref.progress_fit(9, d["nbr_in"], d["nbr_cross"])
    X, y, node = fit["X"], fit["y"], fit["transition_node"]
    later = np.array([ref.usable(i, 9)[int(X[r, 4])].step for r, i in enumerate(node)])
    want = np.full(len(y), np.nan)
    for s_ in np.unique(later):
        before, here = later < s_, later == s_
        if before.sum() < 2:
            continue
        mu, sd = X[before].mean(0), X[before].std(0)
        flat = X[before].max(0) == X[before].min(0)
        scale = np.where(flat, 0.0, 1.0 / np.where(flat, 1.0, sd))
        onehot = np.eye(5)[env[node]]
        design_fit = np.hstack([(X[before] - mu) * scale, onehot[before]])
        design_here = np.hstack([(X[here] - mu) * scale, onehot[here]])
        sk = Ridge(alpha=1.0, fit_intercept=False).fit(design_fit, y[before] - y[before].mean())
        want[here] = y[here] - y[before].mean() - sk.predict(design_here)
    scored = ~np.isnan(want)
    assert 0 < scored.sum() < len(y)   # the first step with transitions has no earlier fit
    np.testing.assert_array_equal(fit["scored"], scored)
    np.testing.assert_allclose(fit["residuals"], want[scored], atol=1e-9)
    np.testing.assert_array_equal(d["progress_n"], np.bincount(node[scored], minlength=40))


def test_progress_constant_column_is_zero():
    design_ref = _progress_scenario()
    d = design_ref.details(7)
    fit = design_ref.progress_fit(7, d["nbr_in"], d["nbr_cross"])
    # v1 is 0 for every transition (constant rewards): standardised column exactly 0
    assert np.all(fit["design"][:, 2] == 0.0)
    assert fit_ridge(np.eye(2), np.array([2.0, 4.0]), 1.0) == pytest.approx([1.0, 2.0])


# =============================================================================================
# Neighbour ordering and truncation windows
# =============================================================================================
def test_neighbour_ties_break_by_lower_index_and_truncate():
    env = np.array([0, 0, 0, 0, 1, 1])
    s_full = np.full((6, 6), 0.6)
    s_full[0, 3] = s_full[3, 0] = 0.9
    np.fill_diagonal(s_full, 1.0)
    s_abs = np.full((6, 6), 0.3)
    np.fill_diagonal(s_abs, 1.0)
    ref = ReferenceEnvSched(s_full, s_abs, env, RefConfig(k_within=2, k_cross=2))
    ref.observe(0, [1, 2, 3, 4, 5], np.full((5, 2), 0.5))
    d = ref.details(1)
    # node 0: observed env mates 1, 2, 3; 3 most similar (.9), then the tie 1, 2 (.6) -> [3, 1]
    assert list(d["nbr_in"][0]) == [3, 1]
    assert list(d["nbr_cross"][0]) == [4, 5]
    assert list(d["nbr_in"][4]) == [5, -1]
    # node 4: cross candidates 1, 2, 3 all tied (0 unobserved) -> [1, 2]
    assert list(d["nbr_cross"][4]) == [1, 2]
    # sigma_in[0] = max(median(1 - .9, 1 - .6) = (.1 + .4)/2, .05) = .25
    assert d["sigma_in"][0] == pytest.approx(0.25, abs=ABS)


def test_truncation_windows():
    env = np.array([0, 0])
    s = np.array([[1.0, 0.5], [0.5, 1.0]])
    cfg = RefConfig(step_capacity=4)
    ref = ReferenceEnvSched(s, s, env, cfg)
    # node 0 observed at steps 0..5, node 1 at steps 0, 1 only
    for t in range(6):
        nodes = [0, 1] if t < 2 else [0]
        ref.observe(t, nodes, np.full((len(nodes), 2), 0.5))
    d = ref.details(6)
    # node 0: the observations within [2, 6), steps 2, 3, 4, 5
    assert d["W"][8.0][0] == pytest.approx(sum(2 ** (-(6 - s) / 8) for s in (2, 3, 4, 5)), abs=ABS)
    # node 1: observations at steps 0, 1 are outside the window [2, 6): W = 0, but still "observed"
    assert d["W"][8.0][1] == 0.0
    assert list(d["nbr_in"][0][:1]) == [1]
    assert [o.step for o in ref.usable(0, 6)] == [2, 3, 4, 5]


# =============================================================================================
# 3. Selection invariants on random scenarios
# =============================================================================================
@pytest.mark.parametrize(
    "seed,n,n_env,batch,excluded_frac",
    [(0, 60, 6, 8, 0.0), (1, 120, 9, 12, 0.05), (2, 200, 12, 16, 0.0), (3, 80, 8, 16, 0.0)],
)
def test_selection_invariants(seed, n, n_env, batch, excluded_frac):
    rng = np.random.default_rng(seed)
    s_full, s_abs, env, excluded = _random_scenario(rng, n, n_env, excluded_frac)
    cfg = RefConfig(batch_size=batch)
    ref = ReferenceEnvSched(s_full, s_abs, env, cfg, excluded=excluded)
    p = rng.beta(0.7, 0.7, size=n)
    # independent book-keeping
    env_cum = np.zeros(n_env, dtype=int)
    obs_count = np.zeros(n, dtype=int)
    sel_count = np.zeros(n, dtype=int)
    history: list[list[int]] = []
    b_cov = batch // 2
    for t in range(9):
        d = ref.details(t) if t >= 1 else None
        picks, phases = ref.select(t)
        assert ref.relaxations[t] == []
        assert len(picks) == batch and len(set(picks)) == batch
        assert not set(picks) & set(excluded)
        counts = np.bincount(env[picks], minlength=n_env)
        if t == 0:
            assert phases == ["cold"] * batch
            reps = _representatives(s_full, env, excluded)
            assert len(reps) <= batch
            assert picks[: len(reps)] == reps
            assert counts.max() <= 2
        else:
            assert phases == ["coverage"] * b_cov + ["exploitation"] * (batch - b_cov)
            assert counts.max() <= cfg.cap_step
            prev = sum(np.bincount(env[history[s]], minlength=n_env) for s in (t - 1, t - 2) if s >= 0)
            assert (prev + counts).max() <= cfg.cap_window
            if t >= 2:
                assert not set(picks) & set(history[t - 1]) & set(history[t - 2])
            q = d["q"]
            for k, (pick, phase) in enumerate(zip(picks, phases)):
                prefix = picks[:k]
                bcount = np.bincount(env[prefix], minlength=n_env) if prefix else np.zeros(n_env, int)

                def run(i):
                    r = 0
                    for s in range(t - 1, -1, -1):
                        if i not in history[s]:
                            break
                        r += 1
                    return r

                elig = [
                    i for i in range(n)
                    if i not in prefix and i not in excluded
                    and bcount[env[i]] < cfg.cap_step
                    and prev[env[i]] + bcount[env[i]] < cfg.cap_window
                    and run(i) < cfg.cap_consecutive
                ]  # fmt: skip
                assert pick in elig
                pen = {i: cfg.lambda_sim * max((s_full[i, j] for j in prefix), default=0.0) for i in elig}
                if phase == "coverage":
                    key = {i: (bcount[env[i]], env_cum[env[i]], obs_count[i]) for i in elig}
                    kmin = min(key.values())
                    assert key[pick] == kmin
                    best = max((i for i in elig if key[i] == kmin), key=lambda i: (q[i] - pen[i], -i))
                else:
                    assert not d["progress_excluded"][pick]
                    cand = [i for i in elig if not d["progress_excluded"][i]]
                    omega = {i: (1 + sel_count[i] / cfg.c0) ** -0.5 for i in cand}
                    best = max(cand, key=lambda i: (q[i] * omega[i] - pen[i], -i))
                assert pick == best
        rewards = _rewards(rng, p, picks, 8)
        ref.observe(t, picks, rewards)
        history.append(list(picks))
        env_cum += counts
        obs_count[picks] += 1
        sel_count[picks] += 1


def test_cold_start_more_environments_than_batch():
    rng = np.random.default_rng(5)
    s_full, s_abs, env, _ = _random_scenario(rng, 60, 12)
    ref = ReferenceEnvSched(s_full, s_abs, env, RefConfig(batch_size=8))
    picks, phases = ref.select(0)
    reps = _representatives(s_full, env)
    assert len(picks) == 8 and set(picks) <= set(reps)
    # first pick: all novelties are 1 on an empty batch -> the lowest-index representative
    assert picks[0] == min(reps)
    # second pick: argmax novelty .5 (1 - max S to batch) + .5 (other env: 1)
    rest = [r for r in reps if r != picks[0]]
    assert picks[1] == max(rest, key=lambda r: (1 - s_full[r, picks[0]], -r))


def _capped_state(policy):
    """N = 10 in 2 environments, B = 8, steps 0 and 1 observed directly (no select)."""
    env = np.array([0] * 5 + [1] * 5)
    rng = np.random.default_rng(7)
    s_full, s_abs, _, _ = _random_scenario(rng, 10, 2)
    ref = ReferenceEnvSched(s_full, s_abs, env, RefConfig(batch_size=8, infeasible=policy))
    ref.observe(0, list(range(8)), np.full((8, 4), 0.5))
    ref.observe(1, [0, 1, 2, 3, 5, 6, 7, 8], rng.uniform(size=(8, 4)))
    # at step 2: nodes 0-3, 5-7 ran 2 steps (cap c); env 0 had 5 + 4 = 9 selections (cap b:
    # 9 + count < 11, at most 2 more), env 1 3 + 4 = 7 (at most 4 more): eligible are only
    # nodes 4, 8, 9, so coverage pick 4 has no candidate.
    return ref


def test_infeasible_error_leaves_state_unchanged():
    ref = _capped_state("error")
    before = copy.deepcopy(ref.__dict__)
    with pytest.raises(ReferenceInfeasible, match=r"step 2.*coverage"):
        ref.select(2)
    assert _state_equal(before, ref.__dict__)
    assert 2 not in ref.relaxations

    # cold start: 2 environments x 2 per environment < B = 8
    env = np.array([0] * 5 + [1] * 5)
    s_full, s_abs, _, _ = _random_scenario(np.random.default_rng(8), 10, 2)
    cold = ReferenceEnvSched(s_full, s_abs, env, RefConfig(batch_size=8))
    before = copy.deepcopy(cold.__dict__)
    with pytest.raises(ReferenceInfeasible, match="step 0"):
        cold.select(0)
    assert _state_equal(before, cold.__dict__)


def test_infeasible_relax_fills_batch_and_records():
    ref = _capped_state("relax")
    picks, phases = ref.select(2)
    assert len(picks) == 8 and len(set(picks)) == 8
    assert phases == ["coverage"] * 4 + ["exploitation"] * 4
    relaxed = ref.relaxations[2]
    assert relaxed and set(relaxed) <= {"progress_filter", "cap_consecutive", "cap_window", "cap_step"}
    assert relaxed[0] == "cap_consecutive"  # first relaxation tried in coverage
    counts = np.bincount(ref.env[picks], minlength=2)
    if "cap_step" not in relaxed:
        assert counts.max() <= 4
    # the first three picks need no relaxation: they are the eligible 4, 8, 9 in some order
    assert set(picks[:3]) == {4, 8, 9}

    # cold start under relax: two per environment lifted, per-step cap 4 kept
    env = np.array([0] * 5 + [1] * 5)
    s_full, s_abs, _, _ = _random_scenario(np.random.default_rng(8), 10, 2)
    cold = ReferenceEnvSched(s_full, s_abs, env, RefConfig(batch_size=8, infeasible="relax"))
    picks, phases = cold.select(0)
    assert len(set(picks)) == 8 and phases == ["cold"] * 8
    assert cold.relaxations[0] == ["cold_two_per_env"] * 4
    assert np.bincount(env[picks]).max() <= 4
    # one environment, B = 8 > C1: the per-step cap has to go as well
    one = ReferenceEnvSched(s_full, s_abs, np.zeros(10, dtype=int), RefConfig(batch_size=8, infeasible="relax"))
    picks, _ = one.select(0)
    assert len(set(picks)) == 8
    # representative + 1 more under the two-per-environment cap; 2 more under C1 = 4; 4 more
    # with C1 dropped too
    assert one.relaxations[0] == ["cold_two_per_env"] * 2 + ["cold_two_per_env", "cap_step"] * 4


def test_relax_progress_filter_first():
    ref = _progress_scenario()
    ref2 = ReferenceEnvSched(ref.s_full, ref.s_abs, ref.env, RefConfig(batch_size=4, infeasible="relax"))
    ref2.__dict__.update({k: copy.deepcopy(v) for k, v in ref.__dict__.items() if k != "config"})
    all_excluded = np.ones(5, dtype=bool)
    picks, phases, relax = ref2._build_batch(7, np.linspace(0.1, 0.5, 5), all_excluded)
    assert len(set(picks)) == 4
    # no cap binds at t = 7; each exploitation pick has to drop the progress filter
    assert relax == ["progress_filter", "progress_filter"]
    ref3 = ReferenceEnvSched(ref.s_full, ref.s_abs, ref.env, RefConfig(batch_size=4))
    ref3.__dict__.update({k: copy.deepcopy(v) for k, v in ref.__dict__.items() if k != "config"})
    with pytest.raises(ReferenceInfeasible, match="exploitation"):
        ref3._build_batch(7, np.linspace(0.1, 0.5, 5), all_excluded)


# =============================================================================================
# 4. Greedy selection worked by hand: the similarity penalty changes the picks
# =============================================================================================
def test_greedy_selection_by_hand():
    env = np.array([0, 0, 0, 1, 1, 1])
    s_full = np.array(
        [
            [1.0, 0.3, 0.9, 0.2, 0.3, 0.1],
            [0.3, 1.0, 0.2, 0.1, 0.9, 0.2],
            [0.9, 0.2, 1.0, 0.1, 0.1, 0.3],
            [0.2, 0.1, 0.1, 1.0, 0.2, 0.4],
            [0.3, 0.9, 0.1, 0.2, 1.0, 0.3],
            [0.1, 0.2, 0.3, 0.4, 0.3, 1.0],
        ]
    )
    q = np.array([0.95, 0.60, 0.55, 0.90, 0.85, 0.50])

    def make(lambda_sim):
        ref = ReferenceEnvSched(s_full, s_full, env, RefConfig(batch_size=4, lambda_sim=lambda_sim))
        # step 0 observed nodes 0 and 3: env selections (1, 1); observation counts (1,0,0,1,0,0);
        # c = (1,0,0,1,0,0); run = 1 for 0 and 3 (< 2: still eligible)
        ref.observe(0, [0, 3], np.full((2, 4), 0.5))
        return ref

    # B = 4: B_cov = 2, B_exp = 2.
    # coverage pick 1: key1 = 0 and key2 = 1 for all; key3 = 0 for {1, 2, 4, 5} (node 0, with the
    #   highest q, is excluded by the lexicographic restriction) -> argmax q over {1,2,4,5}: node 4 (.85)
    # coverage pick 2: key1: env 1 now has 1 -> {0, 1, 2}; key3 -> {1, 2};
    #   node 1: .60 - .08 S[1,4] = .60 - .08*.9 = .528;  node 2: .55 - .08*.1 = .542 -> node 2
    # exploitation, omega(c=1) = (17/16)^(-1/2) = .970143, omega(0) = 1:
    # pick 3 over {0, 1, 3, 5}:
    #   node 0: .95*.970143 - .08 max(S[0,4]=.3, S[0,2]=.9) = .921635 - .072 = .849635
    #   node 1: .60 - .08 max(.9, .2) = .528;  node 3: .90*.970143 - .08 max(.2, .1) = .873128 - .016 = .857128
    #   node 5: .50 - .08 max(.3, .3) = .476  -> node 3
    # pick 4 over {0, 1, 5}: node 0: .921635 - .08 max(.3, .9, .2) = .849635; node 1: .528;
    #   node 5: .50 - .08 max(.3, .3, .4) = .468 -> node 0
    picks, phases = make(0.08).construct_batch(1, q)
    assert picks == [4, 2, 3, 0]
    assert phases == ["coverage", "coverage", "exploitation", "exploitation"]
    # without the penalty: coverage pick 2 -> node 1 (.60 > .55); exploitation: node 0 (.921635)
    # then node 3 (.873128)
    picks0, _ = make(0.0).construct_batch(1, q)
    assert picks0 == [4, 1, 0, 3]


def test_select_does_not_change_state_and_is_repeatable():
    rng = np.random.default_rng(11)
    s_full, s_abs, env, _ = _random_scenario(rng, 60, 6)
    ref = ReferenceEnvSched(s_full, s_abs, env, RefConfig(batch_size=8))
    p = rng.uniform(size=60)
    for t in range(3):
        picks, _ = ref.select(t)
        ref.observe(t, picks, _rewards(rng, p, picks, 4))
    before = copy.deepcopy(ref.__dict__)
    a = ref.select(3)
    b = ref.select(3)
    assert a == b
    before["relaxations"][3] = []
    assert _state_equal(before, ref.__dict__)
    with pytest.raises(ValueError):
        ref.select(5)
    # ranks (2.5, 1, 2.5) -> pr = ((2.5 - .5)/3, (1 - .5)/3, (2.5 - .5)/3)
    assert percentile_rank(np.array([3.0, 1.0, 3.0])) == pytest.approx([2 / 3, 1 / 6, 2 / 3])
