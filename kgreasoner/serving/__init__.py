"""Serving a trained checkpoint: `kgreasoner answer`, the HTTP service, export for `vllm serve`.

- `config.ServeConfig`: model, KG, tool, limits and batching (YAML + `--set`).
- `service.AnswerService`: per-request search sessions and rollout batches over one backend, built
  from `validation` (requests checked, topic entities resolved), `batching` (the queue and its
  worker) and `deadlines` (request timeouts as the rollout engine's stop rule).
- `app.create_app`: the FastAPI app (`/v1/answer`, `/v1/chat/completions`, `/health`, `/metrics`);
  `metrics`: the Prometheus series, through prometheus_client.
- `answer`: the `kgreasoner answer` command and its terminal trace; `export`: LoRA merge and export.

Nothing heavy is imported here: FastAPI, torch and transformers load with the module that needs them.
"""
