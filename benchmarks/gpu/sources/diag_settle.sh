set -euo pipefail
source benchmarks/gpu/install.sh > /dev/null
python3 benchmarks/gpu/sources/profile_pass.py .gpu/run --device cuda --steps 1 --methods history --callees settle 2>&1 | tee "$OUT/diag.txt" | grep -v "^$" | sed -n '/=== history/,$p' | head -120
