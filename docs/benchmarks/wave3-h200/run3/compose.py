# Joins the three calls of the third H200 run into docs/benchmarks/vllm-gpu-ttft.json (run from the repository root).
import json, sys
sys.path.insert(0, "python")
from pegaflow.bench import ttft
run = "docs/benchmarks/wave3-h200/run3/"
a, b, c = (json.load(open(run + f)) for f in ("ttft-a.json", "ttft-load-b.json", "ttft-c.json"))
# run C's embedded (the default, load_in_step auto) joins run A; its outputs_identical was checked
# against run C's own none, kept under merged_runs
c_emb = dict(c, systems={"embedded": c["systems"]["embedded"]}, raw={"embedded": c["raw"]["embedded"]})
merged = ttft.merge(ttft.merge(a, c_emb), b)
merged["merged_runs"][0]["none_of_that_run"] = c["systems"]["none"]
json.dump(merged, open("docs/benchmarks/vllm-gpu-ttft.json", "w"), indent=1)
