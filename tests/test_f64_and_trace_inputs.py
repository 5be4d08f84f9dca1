"""Float64 work is never done in the kernels' f32 (probe 27 D05), and `cleave trace
replay` refuses a workload line that is not an object, or lacks its definition, or an
input stored in safetensors, in one line (D06, D07)."""
from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from backend_case import ctx  # noqa: F401 (a fixture)

import cleave
from cleave.cli.main import main
from cleave.ir import ShapeError, parse_graph
from cleave.runtime.traces import TraceError, load_trace
from cleave.search.encode import encode

TRACES = Path(__file__).parent.parent / "traces"


def _ones_after_1e8():
    """33 f32-exact values whose sum f32 rounds: 1e8 + 32 ones is 100000032 in f64,
    100000024 or less in f32."""
    x = torch.ones(33)
    x[0] = 1e8
    return x


def _compiled(fn, entry):
    torch._dynamo.reset()
    if entry == "cleave.compile":
        return cleave.compile(fn)
    return torch.compile(fn, backend="cleave", dynamic=entry == "dynamic")


@pytest.mark.parametrize("entry", ["cleave.compile", "torch.compile", "dynamic"])
def test_a_sum_with_dtype_float64_is_not_computed_in_f32(entry):
    fn = lambda x: x.sum(dtype=torch.float64)  # noqa: E731
    x = _ones_after_1e8()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = _compiled(fn, entry)(x)
    assert got.dtype == torch.float64 and got.item() == fn(x).item() == 100000032.0


def test_torch_compile_names_the_sum_into_float64_and_what_computes_on_it(ctx):  # noqa: F811
    """Refused where they are translated (graph breaks), not the whole graph after its
    search: a 0-d float64 of a tensor of rank > 0 is no Python number, nor its `+ 1`."""
    fn = lambda x: x.sum(dtype=torch.float64) + 1  # noqa: E731
    x = _ones_after_1e8()
    with pytest.warns(UserWarning) as record:
        got = torch.compile(fn, backend="cleave")(x)
    assert torch.equal(got, fn(x)) and got.item() == 100000033.0
    named = " ".join(str(w.message) for w in record)
    assert "aten.sum.default on float64" in named and "aten.add.Tensor on float64" in named
    assert ctx.stats()["failed"] == 0


@pytest.mark.parametrize("name", ["double_sum", "double_mean", "sum_cast_up_and_scaled"])
def test_f64_arithmetic_after_a_widening_cast_runs_eagerly_with_a_warning(name):
    fn = {"double_sum": lambda x: x.double().sum(),
          "double_mean": lambda x: x.double().mean(),
          "sum_cast_up_and_scaled": lambda x: x[1:].sum().double() * 1.1}[name]
    x = _ones_after_1e8()
    with pytest.warns(UserWarning, match="float64"):
        got = _compiled(fn, "cleave.compile")(x)
    assert torch.equal(got, fn(x))


def _decoded(text: str):
    enc = encode(parse_graph(text))
    graph, _ = enc.decode(enc.outputs)
    return graph


def test_the_search_keeps_a_cast_to_f64_that_a_sum_computes_with():
    graph = _decoded('''graph s {
  %0 = input(name="x", shape=[n], dtype=f32) : f32[n]
  %1 = cast(%0, dtype=f64) : f64[n]
  %2 = reduce(%1, op="sum", axis=0, keepdim=0) : f64[]
  return y=%2
}''')
    (reduce,) = [n for n in graph.live_nodes() if n.op == "reduce"]
    assert reduce.inputs[0].dtype.name == "f64"


def test_widening_casts_that_change_no_computation_are_still_dropped():
    """To f32 (the kernels compute in f32 anyway), or to f64 as the output: the sum is
    searched over the f16/f32 values, the output cast to f64 after it."""
    for source in ("f16", "f32"):
        target = "f32" if source == "f16" else "f64"
        graph = _decoded(f'''graph s {{
  %0 = input(name="x", shape=[n], dtype={source}) : {source}[n]
  %1 = reduce(%0, op="sum", axis=0, keepdim=0) : {source}[]
  %2 = cast(%1, dtype={target}) : {target}[]
  %3 = cast(%0, dtype=f32) : f32[n]
  %4 = exp(%3) : f32[n]
  return y=%2, z=%4
}}''')
        casts = [n for n in graph.live_nodes() if n.op == "cast"]
        assert all(n.inputs[0].op != "input" or n.dtype.name == "f32" for n in casts), graph
        cleave.schedule(graph, {"n": 8})


def test_the_scheduler_refuses_0d_f64_arithmetic_of_a_value_cast_up_only():
    scaled = parse_graph('''graph s {
  %0 = input(name="x", shape=[n], dtype=f32) : f32[n]
  %1 = reduce(%0, op="sum", axis=0, keepdim=0) : f32[]
  %2 = cast(%1, dtype=f64) : f64[]
  %3 = const(value=1.1, dtype=f64) : f64[]
  %4 = mul(%2, %3) : f64[]
  return y=%4
}''')
    with pytest.raises(ShapeError, match="mul %4 computes in float64"):
        cleave.schedule(scaled, {"n": 8})
    by_size = parse_graph('''graph s {
  %0 = input(name="x", shape=[n], dtype=f32) : f32[n]
  %1 = size(value=n, dtype=f64) : f64[]
  %2 = sqrt(%1) : f64[]
  %3 = cast(%2, dtype=f32) : f32[]
  %4 = div(%0, %3) : f32[n]
  return y=%4
}''')
    cleave.schedule(by_size, {"n": 8})
    float_argument = parse_graph('''graph s {
  %0 = input(name="x", shape=[n], dtype=f32) : f32[n]
  %1 = input(name="s", shape=[], dtype=f64) : f64[]
  %2 = const(value=0.5, dtype=f64) : f64[]
  %3 = mul(%1, %2) : f64[]
  %4 = cast(%3, dtype=f32) : f32[]
  %5 = mul(%0, %4) : f32[n]
  return y=%5
}''')
    cleave.schedule(float_argument, {"n": 8})


def test_a_float_argument_under_dynamic_is_still_compiled(ctx):  # noqa: F811
    """dynamo passes it as a 0-d float64 placeholder; its arithmetic is a Python number's."""
    fn = lambda x, s: x * (s * 0.5 + 1)  # noqa: E731
    f = torch.compile(fn, backend="cleave", dynamic=True)
    x = torch.randn(8)
    for s in (0.3, 1.3):
        assert torch.equal(f(x, s), fn(x, s))
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["operators"] == 1, st


# -- cleave trace replay ------------------------------------------------------------

def _trace(tmp_path, *lines: str) -> Path:
    (tmp_path / "definitions").mkdir()
    (tmp_path / "workloads").mkdir()
    shutil.copy(TRACES / "definitions" / "gqa_decode.json", tmp_path / "definitions")
    path = tmp_path / "workloads" / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _replay(path, capsys) -> tuple[int, str]:
    rc = main(["trace", "replay", str(path), "--device", "cpu", "--const", "h=4,hkv=2,d=16"])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("line, kind", [('["a list"]', "list"), ("42", "int")])
def test_a_line_that_is_not_an_object_is_a_one_line_error(tmp_path, capsys, line, kind):
    path = _trace(tmp_path, line)
    with pytest.raises(TraceError, match=f"t.jsonl:1: the line is not a JSON object but {kind}"):
        load_trace(path)
    rc, err = _replay(path, capsys)
    assert rc == 2 and err.splitlines()[-1].startswith("cleave trace: error:") and "Traceback" not in err


def test_a_line_without_its_definition_says_the_key_is_missing(tmp_path):
    good = {"definition": "gqa_decode", "workload": {"uuid": "u", "axes": {"b": 1, "L": 5},
                                                     "inputs": {"q": {"type": "random"}, "k": {"type": "random"},
                                                                "v": {"type": "random"}}}}
    path = _trace(tmp_path, json.dumps({"workload": good["workload"]}))
    with pytest.raises(TraceError, match='t.jsonl:1: the line has no "definition" key'):
        load_trace(path)
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"workload": good["workload"]}) + "\n")
    with pytest.raises(TraceError, match='t.jsonl:3: the line has no "definition" key'):
        load_trace(path)


def test_a_safetensors_input_is_refused_by_name_not_drawn_at_random(tmp_path, capsys):
    line = {"definition": "gqa_decode", "workload": {
        "uuid": "u1", "axes": {"b": 1, "L": 5},
        "inputs": {"q": {"type": "safetensors", "path": "/nonexistent/q.safetensors", "tensor_key": "q"},
                   "k": {"type": "random"}, "v": {"type": "random"}}}}
    rc, err = _replay(_trace(tmp_path, json.dumps(line)), capsys)
    assert rc == 2
    assert "input 'q' has type 'safetensors' (/nonexistent/q.safetensors)" in err


def _line(q: dict, axes=None) -> str:
    return json.dumps({"definition": "gqa_decode", "workload": {
        "uuid": "u1", "axes": axes or {"b": 1, "L": 5},
        "inputs": {"q": q, "k": {"type": "random"}, "v": {"type": "random"}}}})


@pytest.mark.parametrize("q, message, loads", [
    ({"type": "inline", "value": "abc"}, "value holds 'abc', not a number", False),
    ({"type": "scalar"}, "a 'scalar' input has no \"value\"", False),
    ({"type": "scalar", "value": 3}, r"value holds 1 numbers; its shape \[1, 4, 1, 16\] holds 64", True),
    ({"type": "inline", "value": [[1, 2], [3]]}, "value holds 3 numbers", True),
])
def test_a_given_input_that_does_not_fit_its_shape_names_the_workload_and_input(tmp_path, capsys, q, message, loads):
    """A "scalar" or "inline" value of the wrong size or type was a traceback from
    torch (shape '[1, 4, 1, 16]' is invalid), a missing "value" a bare `error: value`.
    Its type is checked with the trace's lines, its size at the axes replay runs."""
    path = _trace(tmp_path, _line({"type": "random"}), _line(q))
    if not loads:
        with pytest.raises(TraceError, match="t.jsonl:2: workload u1: input 'q': " + message):
            load_trace(path)
    rc, err = _replay(path, capsys)
    assert rc == 2 and "Traceback" not in err and "workload u1: input 'q': " in err and \
        re.search(message, err), err


def test_a_malformed_line_past_the_first_is_named_by_its_line(tmp_path):
    path = _trace(tmp_path, _line({"type": "random"}), _line({"type": "random"}), "not json here")
    with pytest.raises(TraceError, match=r"t.jsonl:3: the line is not JSON \(Expecting value at column 1\)"):
        load_trace(path)
    (tmp_path / "b").mkdir()
    path = _trace(tmp_path / "b", _line({"type": "random"}), _line({"type": "random"}, axes={"b": 2}))
    with pytest.raises(TraceError, match=r"t.jsonl:2: workload u1: binds \['b'\]"):
        load_trace(path)


def test_float64_work_under_cleave_compile_is_named_per_op_and_the_rest_compiles():
    """cleave.compile of a program with float64 work: the f64 ops run eagerly, each named
    with its reason (as torch.compile's backend names them), and the f32 work beside them
    compiles. The whole function ran eagerly, the warning blaming a transpose inside
    torch's linear.py (probe of session 43)."""
    torch._dynamo.reset()
    lin = torch.nn.Linear(4, 3).double()

    def f(x, y):
        return lin(y), (x * 2).softmax(-1)

    x, y = torch.randn(5, 6), torch.randn(2, 4, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        compiled = cleave.compile(f)
        got = compiled(x, y)
        compiled(x, y)
    said = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert any("aten.addmm.default" in m and "float64" in m for m in said), said
    assert not any("could not compile" in m or "permute" in m for m in said), said
    want = f(x, y)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert compiled.stats["operators"] >= 1


def test_the_scheduler_names_the_first_op_that_computes_in_float64_not_a_view():
    transposed = parse_graph('''graph s {
  %0 = input(name="w", shape=[m, n], dtype=f64) : f64[m, n]
  %1 = permute(%0, perm=[1, 0]) : f64[n, m]
  %2 = exp(%1) : f64[n, m]
  return y=%2
}''')
    with pytest.raises(ShapeError, match="exp %2 computes in float64"):
        cleave.schedule(transposed, {"m": 3, "n": 5})
