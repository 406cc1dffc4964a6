"""The benchmarks: scripts run by path (`python benchmarks/compare.py`), and modules the tests
import too (`from benchmarks import nexmark`)."""
