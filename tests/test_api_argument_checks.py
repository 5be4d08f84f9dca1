"""A caller's mistake in cleave.search, cleave.schedule and launch is said in one line
naming the argument, before any work; and cleave.explain's fidelity numbers treat NaN
and inf that match eager as matching."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

import cleave
from cleave import fidelity, workloads
from cleave.ir import BindingError, parse_graph
from cleave.rules import all_rules
from cleave.runtime.launch import launch

EXAMPLES = Path(__file__).parent.parent / "docs" / "examples"
QUANT_RULES = EXAMPLES / "quantization.rules"
SCALED_MATMUL = EXAMPLES / "scaled_matmul.graph"


def _row_sum() -> cleave.Graph:
    g = cleave.Graph("rowsum")
    x = g.input("x", ("m", "n"), "f32")
    return g.output(x.exp().sum(-1), names=["o"])


# -- cleave.search ----------------------------------------------------------------
def test_search_of_a_non_graph_says_what_a_graph_comes_from():
    with pytest.raises(TypeError, match=r"search: graph must be a cleave Graph \(from cleave.capture.*"
                                        r"cleave.parse_graph.*got str 'graph'"):
        cleave.search("graph")


def test_search_of_a_graph_without_outputs_says_so():
    """It returned a candidate of cost 0 that computes nothing."""
    g = cleave.Graph("empty")
    g.input("x", ("m",), "f32")
    with pytest.raises(ValueError, match=r"search: graph 'empty' has no outputs"):
        cleave.search(g, progress=False)


@pytest.mark.parametrize("as_given", [lambda p: [str(p)], lambda p: str(p), lambda p: p],
                         ids=["list of paths", "one path string", "one Path"])
def test_search_takes_rule_files_as_cleave_compile_does(as_given):
    """The library plus the file's rules: the file's colscale-after-matmul makes a candidate."""
    result = cleave.search(parse_graph(SCALED_MATMUL.read_text()), rules=as_given(QUANT_RULES), progress=False)
    assert any(c.derivation == ["colscale-after-matmul"] for c in result.candidates)
    assert "colscale-after-matmul" in result.stats["rules_fired"]


@pytest.mark.parametrize("rules, message", [
    ([42], r"search: rules must be Rule objects or rule file paths, got 42"),
    (42, r"search: rules must be a list of Rule objects or of rule file paths, got 42"),
    (lambda: [all_rules()[0], str(QUANT_RULES)], r"search: rules mixes Rule objects and rule file "
                                                 r"paths \('.*quantization.rules'\); give one kind"),
    (lambda: [str(QUANT_RULES), 3], r"search: rules must be Rule objects or rule file paths, got 3"),
])
def test_search_refuses_rules_that_are_neither_rules_nor_paths(rules, message):
    with pytest.raises(TypeError, match=message):
        cleave.search(_row_sum(), rules=rules() if callable(rules) else rules, progress=False)


@pytest.mark.parametrize("value", [-4, "a", 2.5, True, None])
def test_search_shapes_are_integers_at_least_zero(value):
    with pytest.raises(ValueError, match=rf"search: shapes\['m'\] must be an integer >= 0, got {value!r}"):
        cleave.search(_row_sum(), shapes={"m": value, "n": 3}, progress=False)


def test_search_shapes_name_symbols_of_the_graph():
    with pytest.raises(ValueError, match=r"search: shapes names 'zz', which is not a symbol of graph 'rowsum' "
                                         r"\(its symbols: m, n\)"):
        cleave.search(_row_sum(), shapes={"zz": 4}, progress=False)
    with pytest.raises(ValueError, match=r"search: shapes must be a dict \{symbol: extent\}, got \[1\]"):
        cleave.search(_row_sum(), shapes=[1], progress=False)


def test_search_shapes_that_break_the_graphs_constraints_are_refused():
    """moe_routing's topk keeps 8 <= e: at e = 4 every candidate failed the check, and
    the warning blamed the rules that derived them."""
    graph = workloads.get("moe_routing").graph
    with pytest.raises(ValueError, match=r"search: shapes \{'t': 4, 'e': 4\} break the graph's constraint 8 <= e"):
        cleave.search(graph, shapes={"t": 4, "e": 4}, progress=False)


def test_search_shapes_may_hold_an_empty_axis():
    assert cleave.search(_row_sum(), shapes={"m": 0, "n": 3}, progress=False).candidates


# -- cleave.schedule --------------------------------------------------------------
def test_schedule_of_a_graph_without_outputs_says_so():
    g = cleave.Graph("empty")
    g.input("x", ("m",), "f32")
    with pytest.raises(BindingError, match=r"schedule: graph 'empty' has no outputs"):
        cleave.schedule(g, {"m": 3})


def test_schedule_of_a_non_graph_says_what_it_takes():
    with pytest.raises(TypeError, match=r"schedule: candidate must be a cleave Graph or a search Candidate.*"
                                        r"got str 'graph'"):
        cleave.schedule("graph", {"m": 3})


def _split_graph() -> cleave.Graph:
    g = cleave.Graph("bsplit")
    x = g.input("x", ("m", "n"), "f32")
    return g.output(x.split(1, "c").exp().sum(-1).max(-1), names=["o"])  # max over chunk sums: a function of c


def test_schedule_refuses_a_split_count_in_shapes_it_would_drop():
    """shapes {"c": 4} was accepted and every plan split by 1: another function of c."""
    with pytest.raises(BindingError, match=r"shapes binds c, a split count of the graph: fix it with split="):
        cleave.schedule(_split_graph(), {"m": 3, "n": 12, "c": 4})
    assert all(p.split == {"c": 4} for p in cleave.schedule(_split_graph(), {"m": 3, "n": 12}, split={"c": 4}))


def test_schedule_refuses_a_target_that_is_no_target():
    with pytest.raises(TypeError, match=r"schedule: target must be a cleave Target.*got str 'h100'"):
        cleave.schedule(_split_graph(), {"m": 3, "n": 12}, target="h100")


def test_interpret_names_a_split_count_no_input_gives():
    with pytest.raises(BindingError, match=r"interpret: no value for c .*pass env=\{'c': ...\}"):
        cleave.interpret(_split_graph(), {"x": torch.randn(3, 12)})


def test_builder_refuses_an_operand_that_is_no_node_nor_number():
    g = cleave.Graph("g")
    a = g.input("a", ("n",), "f32")
    with pytest.raises(TypeError, match=r"an operand beside input %0 is a NoneType None"):
        a + None
    with pytest.raises(cleave.ir.ShapeError, match=r"output 'o' is 3 \(int\), not a node of graph 'g'"):
        g.output(3, names=["o"])


# -- launch -----------------------------------------------------------------------
def _iota_graph() -> cleave.Graph:
    g = cleave.Graph("io")
    g.input("x", ("m",), "f32")
    return g.output(g.iota(("q",), 0), names=["o"])


def test_launch_takes_a_static_symbol_no_input_binds_from_the_plan():
    from cleave.runtime.launch import launch

    plan = cleave.schedule(_iota_graph(), {"m": 3, "q": 4})[0]
    (out,) = launch(plan, {"x": torch.randn(3)})
    assert out.tolist() == [0, 1, 2, 3]


def test_launch_names_a_dynamic_symbol_no_input_binds():
    from cleave.runtime.launch import launch

    plan = cleave.schedule(_iota_graph(), {"m": 3, "q": 4}, dynamic=["q"])[0]
    with pytest.raises(BindingError, match=r"no input's shape binds symbol\(s\) q, and launch reads dynamic symbols "
                                           r"from the input shapes only: schedule with them static"):
        launch(plan, {"x": torch.randn(3)})


def test_launch_refuses_an_input_the_graph_does_not_have():
    """A misspelt name was ignored (the graph's own input then reported missing, or an
    unread extra one dropped without a word)."""
    from cleave.runtime.launch import launch

    plan = cleave.schedule(_row_sum(), {"m": 3, "n": 5})[0]
    with pytest.raises(BindingError, match=r"launch: 'mask' is not an input of graph 'rowsum' \(its inputs: x\)"):
        launch(plan, {"x": torch.randn(3, 5), "mask": torch.ones(3, 5)})


def test_launch_refuses_out_tensors_it_would_write_wrongly():
    """out= aliasing an input (later programs read what earlier ones wrote: 0.9999 off,
    said nothing), of another dtype (truncated into int32), or of another count, and
    arguments of the wrong kind (an AttributeError from inside launch)."""
    import numpy as np

    from cleave.runtime.launch import launch

    plan = cleave.schedule(_row_sum(), {"m": 3, "n": 5})[0]
    x = torch.randn(3, 5)
    with pytest.raises(BindingError, match=r"out= output 'o' shares memory with input 'x'"):
        launch(plan, {"x": x}, out=[x[0, :3]])
    with pytest.raises(BindingError, match=r"output 'o': the plan writes torch.float32, out= gives torch.int32"):
        launch(plan, {"x": x}, out=[torch.zeros(3, dtype=torch.int32)])
    with pytest.raises(BindingError, match=r"out= has 2 tensor\(s\), the plan 1 output\(s\)"):
        launch(plan, {"x": x}, out=[torch.zeros(3), torch.zeros(3)])
    with pytest.raises(BindingError, match=r"input 'x' is a ndarray, not a torch.Tensor"):
        launch(plan, {"x": np.ones((3, 5), np.float32)})
    with pytest.raises(BindingError, match=r"inputs are a dict of tensors by input name, got a list"):
        launch(plan, [x])
    with pytest.raises(BindingError, match=r"out= is a list of tensors"):
        launch(plan, {"x": x}, out=[None])
    got = launch(plan, {"x": x}, out=[torch.full((3,), float("nan"))])[0]
    torch.testing.assert_close(got, x.exp().sum(-1))


def test_launch_says_when_it_rounds_an_input_to_the_plans_dtype():
    """An f64 tensor given to an f32 plan was rounded to f32 without a word; a bf16 one
    widens exactly, and is converted silently."""
    from cleave.runtime.launch import InputCastWarning, launch

    plan = cleave.schedule(_row_sum(), {"m": 3, "n": 5})[0]
    x = torch.randn(3, 5, dtype=torch.float64)
    with pytest.warns(InputCastWarning, match=r"launch: input 'x' is torch.float64, and the plan takes torch.float32"):
        (o,) = launch(plan, {"x": x})
    torch.testing.assert_close(o, x.float().exp().sum(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputCastWarning)
        launch(plan, {"x": x.to(torch.bfloat16)})
    half = cleave.schedule(cleave.parse_graph(_row_sum().text().replace("f32", "bf16")), {"m": 3, "n": 5})[0]
    with pytest.warns(InputCastWarning, match=r"is torch.float16, and the plan takes torch.bfloat16"):
        launch(half, {"x": x.half()})  # same width, another rounding: not exact either way


def test_launch_says_when_it_narrows_an_integer_input():
    """int64 indices given to an int32 plan wrapped past 2**31 without a word; int16
    widens exactly, and an integer too wide for the plan's float significand rounds."""
    from cleave.runtime.launch import InputCastWarning, launch

    g = cleave.Graph("isum")
    i = g.input("i", ("m", "n"), "i32")
    plan = cleave.schedule(g.output(i.sum(-1), names=["o"]), {"m": 3, "n": 5})[0]
    big = torch.full((3, 5), 2**31 + 7, dtype=torch.int64)
    with pytest.warns(InputCastWarning, match=r"input 'i' is torch.int64, and the plan takes torch.int32: .*"
                                              r"wraps values outside torch.int32's range"):
        launch(plan, {"i": big})
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputCastWarning)
        (o,) = launch(plan, {"i": torch.arange(15, dtype=torch.int16).reshape(3, 5)})
    assert o.tolist() == [10, 35, 60]
    with pytest.warns(InputCastWarning, match=r"is torch.int32, and the plan takes torch.float32: .* rounds it"):
        launch(cleave.schedule(_row_sum(), {"m": 3, "n": 5})[0], {"x": torch.ones(3, 5, dtype=torch.int32)})


# -- fidelity ---------------------------------------------------------------------
def test_matching_nan_and_inf_compare_equal():
    want = torch.tensor([[1.0, math.nan, math.inf], [-math.inf, 2.0, 3.0], [math.nan, math.nan, -math.inf]])
    assert fidelity.compare(want.clone(), want) == {"max_abs": 0.0, "kl": 0.0}


@pytest.mark.parametrize("where, value", [((0, 0), math.nan), ((0, 1), math.inf), ((0, 2), 1.0),
                                          ((1, 0), -math.inf), ((0, 2), -math.inf)])
def test_a_non_finite_mismatch_shows_as_inf(where, value):
    want = torch.tensor([[1.0, 2.0, math.inf], [3.0, 4.0, 5.0]])
    got = want.clone()
    got[where] = value
    assert fidelity.compare(got, want) == {"max_abs": math.inf, "kl": math.inf}


def test_a_masked_row_keeps_a_finite_kl():
    """-inf logits in both (a causal mask) are probability 0 on both sides."""
    want = torch.tensor([[0.5, -math.inf, -math.inf], [0.25, 0.5, 0.75]])
    got = want + torch.tensor([[0.0, 0.0, 0.0], [0.0, 1e-3, 0.0]])
    result = fidelity.compare(got, want)
    assert result["max_abs"] == pytest.approx(1e-3, rel=1e-4) and 0 < result["kl"] < 1e-6


def test_explain_reports_outputs_equal_to_eager_with_nan_and_inf_as_equal():
    compiled = cleave.compile(lambda x: (torch.log(x), x / 0.0), verbose=False)
    x = torch.tensor([[1.0, -1.0, 0.0, 2.0], [-3.0, 4.0, 0.5, -0.5]])
    with torch.no_grad():
        report = cleave.explain(compiled, x)
    for f in report.fidelity:
        assert f["max_abs"] < 1e-6 and 0 <= f["kl"] < 1e-9, f


@pytest.mark.parametrize("rules", [[42], 42, ["ok.rules", None]])
def test_compile_refuses_rules_that_are_not_paths(rules):
    with pytest.raises(TypeError, match="rules: a rule file's path"):
        cleave.compile(lambda x: x + 1, rules=rules)


def test_compile_refuses_an_artifact_that_is_a_file(tmp_path):
    """It warned about "the cache" at the first call and kept its plans in memory."""
    path = tmp_path / "plans.json"
    path.write_text("{}")
    with pytest.raises(NotADirectoryError, match="artifact must be a directory.*plans.json' is a file"):
        cleave.compile(lambda x: x + 1, artifact=path)


def test_search_with_an_empty_rule_list_is_the_library_as_in_cleave_compile():
    """rules=[] is no rule files: the library, as cleave.compile(rules=[]) reads it (the
    search ran with no rule at all)."""
    graph = parse_graph(SCALED_MATMUL.read_text())
    default = cleave.search(graph, progress=False)
    empty = cleave.search(graph, rules=[], progress=False)
    assert default.stats["rules_fired"] and empty.stats["rules_fired"] == default.stats["rules_fired"]
    assert [c.derivation for c in empty.candidates] == [c.derivation for c in default.candidates]


@pytest.mark.parametrize("dynamic, said", [
    ({"x": [0]}, r"dynamic\['x'\] must be a dict \{axis: symbol\}, not \[0\]"),
    ({"x": None}, r"dynamic\['x'\] must be a dict"),
    ({"x": {"0": "n"}}, r"dynamic\['x'\]: axis '0' is not an int"),
    ({"x": {True: "n"}}, r"dynamic\['x'\]: axis True is not an int"),
])
def test_capture_checks_its_dynamic_axes_as_compile_does(dynamic, said):
    """cleave.capture raised AttributeError or TypeError from inside, or read True as axis 1."""
    from cleave.frontends import CaptureError

    with pytest.raises(CaptureError, match=said):
        cleave.capture(lambda x: x * 2, torch.randn(3, 4), dynamic=dynamic)


def _exp_rows():
    g = cleave.Graph("g")
    g.output(g.input("x", ("m", "n"), "f32").exp().sum(-1), names=["o"])
    return cleave.schedule(g, {"m": 3, "n": 5})


@pytest.mark.parametrize("plan, message", [
    (lambda plans: plans, r"launch: plan is a list, not a cleave Plan \(cleave.schedule returns a list: pass one"),
    (lambda plans: plans[0].to_json(), r"launch: plan is a dict, not a cleave Plan \(Plan.from_json reads"),
    (lambda plans: None, r"launch: plan is a NoneType, not a cleave Plan$")])
def test_launch_says_what_a_plan_is(plan, message):
    """A list from cleave.schedule, or a plan's JSON, was an AttributeError about __dict__."""
    with pytest.raises(TypeError, match=message):
        launch(plan(_exp_rows()), {"x": torch.randn(3, 5)})


def test_plan_from_json_says_what_it_reads():
    import json

    from cleave.scheduler.plan import Plan

    plan = _exp_rows()[0]
    with pytest.raises(TypeError, match=r"Plan.from_json takes the dict Plan.to_json gives .*got a str"):
        Plan.from_json(json.dumps(plan.to_json()))
    with pytest.raises(ValueError, match=r"Plan.from_json: the dict lacks 'kernels' \(not a plan's JSON\)"):
        Plan.from_json({k: v for k, v in plan.to_json().items() if k != "kernels"})
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))).kernels[0].source == plan.kernels[0].source


def test_launch_refuses_an_input_on_the_meta_device():
    # it failed inside Triton's interpreter: "Cannot copy out of meta tensor; no data!"
    with pytest.raises(BindingError, match=r"launch: input 'x' is on the meta device: it holds no data"):
        launch(_exp_rows()[0], {"x": torch.randn(3, 5, device="meta")})


def test_launch_names_a_strided_out_tensor_as_not_contiguous():
    # "expected a contiguous tensor of shape [3], got [3]"
    with pytest.raises(BindingError, match=r"output 'o': expected a contiguous tensor of shape \[3\], got a tensor "
                                           r"of that shape with strides \(2,\), not contiguous"):
        launch(_exp_rows()[0], {"x": torch.randn(3, 5)}, out=[torch.empty(6)[::2]])
