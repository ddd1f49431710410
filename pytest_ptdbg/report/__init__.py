"""Report writers: the CSV (ptdbg columns), the advisor text file and the HTML report (no torch)."""
