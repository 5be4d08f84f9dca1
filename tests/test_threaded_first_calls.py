"""First calls made in worker threads at once (a server's request threads) compile:
proofs of the rules ran in two threads at once and z3's context failed ("Context
mismatch"), and each search's e-graph was freed later by whichever thread collected
garbage, which egglog refuses ("EGraph is unsendable"), leaking it."""
import gc
import sys
import threading

import torch

import cleave  # noqa: F401 (registers the backend)


def layer(x, w):
    return torch.tanh(x @ w) * 3 + 0.25


def test_first_calls_in_threads_compile_and_free_their_e_graphs(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(str(u.exc_value)))
    w = torch.randn(8, 4)
    f = torch.compile(layer, backend="cleave", dynamic=True)
    results, errors = {}, []
    gc.collect()  # an e-graph another test left in a cycle is not this test's

    def work(n):
        try:
            x = torch.randn(n, 8)
            with torch.no_grad():
                results[n] = (f(x, w), layer(x, w))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(n,)) for n in (2, 3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert not errors, errors
    for got, want in results.values():
        torch.testing.assert_close(got, want)
    assert not unraisable, unraisable
    err = capfd.readouterr().err
    assert "could not compile" not in err, err[-2000:]


def test_an_e_graph_collected_on_another_thread_waits_for_its_own(monkeypatch):
    """An e-graph caught in a cycle (a kept traceback) is collected by whichever thread
    collects next; egglog cannot free it there, so its own thread frees it at its next
    search."""
    from cleave.search import egraph as E

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(str(u.exc_value)))
    gc.collect()
    cycle = [E.new_egraph()]
    cycle.append(cycle)
    del cycle
    worker = threading.Thread(target=gc.collect)
    worker.start()
    worker.join()
    assert not unraisable, unraisable
    assert len(E._STRANDED.get(threading.current_thread(), [])) == 1
    E.new_egraph()
    assert threading.current_thread() not in E._STRANDED
    assert not unraisable, unraisable
