"""dev/bench_step.py runs: its sides at each precision, and a tiny bf16 run (issue 21) that
prints the bf16 GEMM peak next to the sgemm one and writes them into --json."""
import json

from dev import bench_step


def side_names(argv, use_torch=True):
    return [name for name, _, _ in bench_step.sides_for(bench_step.parse_args(argv), use_torch)]


def test_sides_at_each_precision():
    assert side_names([]) == ["llm.pyx", "PyTorch"]            # fp32: as before issue 21
    assert side_names([], use_torch=False) == ["llm.pyx"]
    assert side_names(["--precision", "bf16"]) == ["llm.pyx bf16", "PyTorch fp32", "PyTorch bf16"]
    args = bench_step.parse_args(["--compare-precisions"])
    assert args.precision == "bf16"
    assert side_names(["--compare-precisions"], use_torch=False) == ["llm.pyx bf16", "llm.pyx fp32"]
    assert side_names(["--compare-precisions", "--grad-precision", "bf16", "-w", "0"],
                      use_torch=False) == ["llm.pyx bf16 bf16-grads -w0", "llm.pyx fp32"]
    # every peer of llm.pyx bf16 has a target to print
    assert all(name in bench_step.TARGETS for name in side_names(["--compare-precisions"])[1:])


def test_bf16_run_prints_both_peaks(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench_step.main(["--precision", "bf16", "--no-torch", "-e", "2", "-b", "1", "-t", "16",
                            "--steps", "1", "--warmup", "1", "--rounds", "1",
                            "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("llm.pyx training step in bf16 (its GEMMs: ")
    peak_line = next(line for line in out.splitlines() if line.startswith("measured peaks"))
    assert "bf16 GEMM" in peak_line and "kernels.matmul_bf16 2048^3" in peak_line
    assert "fp32 sgemm" in peak_line and "kernels.matmul 2048^3" in peak_line
    assert any(line.startswith("llm.pyx bf16 ") for line in out.splitlines())
    assert "llm.pyx bf16 / GEMM-only" in out
    result = json.loads(path.read_text())
    assert result["precision"] == "bf16"
    assert result["peak"]["bf16_gflops"] > 0 and result["peak"]["gflops"] > 0
    assert result["results"]["llm.pyx bf16"]["precision"] == "bf16"
    assert result["gemm_only_bf16"] > 0
