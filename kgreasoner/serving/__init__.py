"""Serving a trained checkpoint: `kgreasoner answer`, the HTTP service, export for `vllm serve`.

- `config.ServeConfig`: model, KG, tool, limits and batching (YAML + `--set`).
- `service.AnswerService`: validation, per-request search sessions, batched rollouts, timeouts.
- `app.create_app`: the FastAPI app (`/v1/answer`, `/v1/chat/completions`, `/health`, `/metrics`).
- `answer`: the `kgreasoner answer` command and its terminal trace; `export`: LoRA merge and export.

Nothing heavy is imported here: FastAPI, torch and transformers load with the module that needs them.
"""
