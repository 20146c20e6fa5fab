"""Workload names, the mixture syntax and the native sampler."""

import math

import numpy as np
import pytest

from malcolm.workloads import NAMED, Component, Workload, parse_workload

MEANS = {"exp:50": 50.0, "bimodal": 95.0, "hyperexp1": 275.0, "hyperexp2": 387.5,
         "rocksdb1": 37.0, "rocksdb2": 65.0, "fig2.1a": 20.0, "fig2.1b": 39.0,
         "fig3.2a": 505.0, "fig3.2b": 0.999 * 25 + 0.001 * 25025,
         "rocksdb1-measured": 68.374148, "rocksdb2-measured": 109.776879}  # the shipped calibration


@pytest.mark.parametrize("name,mean", sorted(MEANS.items()))
def test_named_means(name, mean):
    w = parse_workload(name)
    assert w.mean_us == pytest.approx(mean)
    nw = w.native()
    assert nw.mean_ns == pytest.approx(mean * 1e3)
    types, svc = nw.sample(400_000, seed=1)
    assert svc.mean() / 1e3 == pytest.approx(mean, rel=0.03 if name != "fig3.2b" else 0.1)
    for t, p in enumerate(w.weights):
        assert np.mean(types == t) == pytest.approx(p, abs=0.004)
    # each type's draws come from its own component
    c0 = w.components[0]
    assert svc[types == 0].mean() / 1e3 == pytest.approx(c0.mean_us, rel=0.02)


def test_all_named_are_listed():
    assert set(MEANS) - {"exp:50"} == set(NAMED)


def test_bimodal_is_two_constants():
    types, svc = parse_workload("bimodal").native().sample(10_000, seed=2)
    assert set(np.unique(svc)) == {50_000.0, 500_000.0}
    assert np.all(svc[types == 1] == 500_000.0)


def test_rocksdb_is_near_constant():
    w = parse_workload("rocksdb2")
    types, svc = w.native().sample(200_000, seed=3)
    get16 = svc[types == 0] / 1e3
    assert get16.mean() == pytest.approx(30.0, rel=0.01)
    assert get16.std() / get16.mean() == pytest.approx(0.1, rel=0.1)


def test_measured_rocksdb_reproduces_its_quantiles():
    """rocksdb*-measured: two empirical types in one mixture; both samplers follow the
    recorded quantiles of each GET size."""
    from malcolm._workload import NativeWorkload

    from malcolm import workloads
    w = parse_workload("rocksdb2-measured")
    types, svc = w.native().sample(400_000, seed=4)
    t2, s2 = w.sample(400_000, np.random.default_rng(4))
    cal = workloads.read_calibration(workloads.CALIBRATION_FILE)
    for t, (ps, pts) in ((0, cal[16]), (1, cal[64])):
        for p, x in zip(ps, pts, strict=True):
            if 0.05 <= p <= 0.99:
                assert np.quantile(svc[types == t], p) / 1e3 == pytest.approx(x, rel=0.02)
                assert np.quantile(s2[t2 == t], p) == pytest.approx(x, rel=0.02)
        assert svc[types == t].min() / 1e3 >= pts[0] and svc[types == t].max() / 1e3 <= pts[-1]
    q = w.components[0].table
    with pytest.raises(ValueError, match="at most 2"):
        NativeWorkload([1, 1, 1], [4, 4, 4], [0, 0, 0], [0, 0, 0], tables=[q, q, q])


def test_mixture_syntax():
    w = parse_workload("mix:90:const:50,10:exp:500")
    assert w.n_types == 2 and w.mean_us == pytest.approx(95.0)
    w = parse_workload("mix:1:uniform:10:30,3:lognormal:40:0.5")
    assert w.weights.tolist() == [0.25, 0.75]
    assert w.mean_us == pytest.approx(0.25 * 20 + 0.75 * 40)
    t, x = w.native().sample(200_000, seed=1)
    assert x[t == 0].min() >= 10e3 and x[t == 0].max() <= 30e3
    assert x.mean() / 1e3 == pytest.approx(35.0, rel=0.02)


def test_numpy_sampler_agrees():
    w = parse_workload("hyperexp2")
    types, svc = w.sample(400_000, np.random.default_rng(1))
    assert svc.mean() == pytest.approx(w.mean_us, rel=0.03)
    assert np.mean(types == 2) == pytest.approx(0.05, abs=0.002)


def test_scv():
    assert parse_workload("exp:10").scv == pytest.approx(1.0)
    assert parse_workload("mix:1:const:5").scv == pytest.approx(0.0)


def test_same_seed_same_draws():
    nw = parse_workload("hyperexp1").native()
    a = nw.sample(1000, seed=5)
    b = nw.sample(1000, seed=5)
    c = nw.sample(1000, seed=6)
    assert np.array_equal(a[1], b[1]) and not np.array_equal(a[1], c[1])


@pytest.mark.parametrize("bad,msg", [
    ("gauss", "unknown workload"), ("exp:", "not a number"), ("exp:-3", "> 0"),
    ("mix:", "at least one component"), ("mix:1:exp", "W:DIST:PARAMS"),
    ("mix:1:foo:3", "unknown distribution"), ("mix:0:exp:3", "> 0"),
    ("mix:1:exp:3:4", "takes 1 parameter"), ("mix:1:uniform:5:2", "LO <= HI"),
    ("mix:x:exp:3", "not a number"), ("", "non-empty"),
    ("mix:" + ",".join(["1:exp:1"] * 17), "at most 16"),
    ("const:", "not a number"), ("const:5:6", "takes 1 parameter"),
    ("uniform:5", "takes 2 parameter"), ("lognormal:30:9", "at most 3"),
])
def test_bad_workloads(bad, msg):
    with pytest.raises(ValueError, match=msg):
        parse_workload(bad)


@pytest.mark.parametrize("spec,args", [
    ("exp:-5", (1, "exp", -5.0)), ("mix:0:exp:3", (0, "exp", 3.0)),
    ("exp:nan", (1, "exp", math.nan)), ("exp:inf", (1, "exp", math.inf)),
    ("const:2e6", (1, "const", 2e6)), ("exp:1e-9", (1, "exp", 1e-9)),
    ("uniform:5:2", (1, "uniform", 5.0, 2.0)), ("uniform:-1:2", (1, "uniform", -1.0, 2.0)),
    ("lognormal:30:9", (1, "lognormal", 30.0, 9.0)), ("mix:1e10:exp:3", (1e10, "exp", 3.0)),
])
def test_a_hand_built_workload_has_the_parsers_limits(spec, args):
    """A Workload or Component built by hand skipped the parser's checks: a negative, NaN or
    infinite mean, a zero weight (every weight NaN) or a sigma of 9 ran. The constructor
    refuses each with the parser's own words (one check function for both); only where
    the message starts and how the number is written differ."""
    with pytest.raises(ValueError) as parsed:
        parse_workload(spec)
    with pytest.raises(ValueError) as built:
        Workload("hand", (Component(*args),))
    assert str(parsed.value).startswith(f"workload {spec!r}: ")
    assert str(built.value).startswith(f"workload component {args[1]!r}: ")
    words = [str(e.value).split(": ", 1)[1].split(", got")[0] for e in (parsed, built)]
    assert words[0] == words[1]


@pytest.mark.parametrize("make,exc,msg", [
    (lambda: Component(1, "exp", "50"), TypeError, "mean must be a number"),
    (lambda: Component(True, "exp", 50), TypeError, "weight must be a number"),
    (lambda: Component(1, "gauss", 50), ValueError, "unknown distribution"),
    (lambda: Component(1, "empirical", 50), ValueError, "2048 rising quantiles"),
    (lambda: Workload("w", ()), ValueError, "at least one component"),
    (lambda: Workload("w", (Component(1, "exp", 5),) * 17), ValueError, "at most 16"),
    (lambda: Workload("w", ("exp:5",)), TypeError, "tuple of Component"),
    (lambda: Workload(5, (Component(1, "exp", 5),)), TypeError, "name must be a string"),
])
def test_a_hand_built_workload_is_refused_with_one_clear_line(make, exc, msg):
    with pytest.raises(exc, match=msg):
        make()


def test_a_hand_built_workload_within_the_limits_still_builds():
    w = Workload("hand", [Component(3, "exp", 50.0), Component(1, "uniform", 0.0, 10.0)])
    assert isinstance(w.components, tuple) and w.mean_us == pytest.approx(38.75)
    assert Workload.empirical([1.0, 2.0, 3.0]).mean_us == pytest.approx(2.0)


@pytest.mark.parametrize("alone,mixed", [
    ("const:5", "mix:1:const:5"), ("uniform:2:8", "mix:1:uniform:2:8"),
    ("lognormal:30:0.1", "mix:1:lognormal:30:0.1"), ("CONST:5", "mix:1:const:5"),
])
def test_one_distribution_alone_is_one_type(alone, mixed):
    # a DIST without mix: is the one-type mixture, as exp:MEAN is
    a, b = parse_workload(alone), parse_workload(mixed)
    assert a.components == b.components and a.n_types == 1 and a.name == alone
