"""The transformers backend: one batched decode loop with a KV cache, tool blocks spliced in.

Design (why it is correct and fast):

- One `DynamicCache` for the whole batch, prompts padded on the left. Every forward passes an
  explicit 2-D attention mask and explicit per-row `position_ids`, so a cache column is just
  "a key at some position of some row": columns whose mask is 0 are invisible, and each row's
  positions count only its own real tokens. Rows can therefore have different lengths and
  holes without any change to the model.
- Each step samples one token per row and hands it to `RolloutEngine.accept`. All live rows
  then feed their token in one `(B, 1)` decode forward.
- Rows that wrote `</search>` get their tool block right away: the block's ids (left-padded
  among those rows) are run in one extra forward over those rows only — their slice of the
  cache is taken, extended by the block, and written back into new columns that are masked
  out for the other rows. The block's last position gives those rows' next logits; the rows
  that did not call the tool are not touched and do not wait. No row ever re-runs its prefix.
  When every live row calls the tool in the same step, the block runs on the full cache.
- Holes (block columns of rows that did not call, finished rows) cost attention time, so the
  cache is repacked — finished rows dropped, each row's real columns gathered to the right —
  when a quarter of the rows are finished or holes exceed `compact_slack` columns. Keys are
  stored after RoPE at their own positions, so moving columns does not change any result.
- A prompt prefix shared by all rows (the system prompt; the whole prompt for repeated GRPO
  generations) is prefilled once and its cache broadcast to the batch.
- Sampling: logits processors (callables `(rows, logits) -> logits`, e.g. test scripts), then
  the constrained-decoding mask, then temperature; the logprob is read from
  `log_softmax(logits / T)` before top-k/top-p filtering (see `engine` for why); the token is
  drawn from the filtered distribution with a seeded `torch.Generator`. Temperature 0 is greedy.

Only full-attention decoder layers (`DynamicLayer`) are supported, which covers Qwen3 and LLaMA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.cache_utils import DynamicLayer
from transformers.utils import GENERATION_CONFIG_NAME

from kgreasoner.rollout.types import RowState, SamplingParams, StepBackend, StepDriver

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LogitsProcessor = Callable[[Sequence[RowState], torch.Tensor], torch.Tensor]
"""`(rows, logits [B, V]) -> logits`, applied before the constrained-decoding mask and temperature."""
MIN_SPARE_COLUMNS = 64
"""Cache columns allocated ahead of need (the buffer then grows by half its length)."""
MIN_SHARED_PREFIX = 8
"""Prompt tokens all rows must share before the prefix is computed once for the batch."""


def eos_token_ids(
    model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase, model_dir: str | Path | None = None
) -> list[int]:
    """The generation config's EOS ids plus the tokenizer's EOS id.

    The generation config is the model's; without a model object (a vLLM engine or server), the
    `generation_config.json` saved in `model_dir`, by default the folder the tokenizer was loaded from,
    when it has one. A chat model stops at more than its tokenizer's EOS: Qwen3 at <|endoftext|> as well
    as <|im_end|>, Llama 3.1 at <|end_of_text|> and <|eom_id|> as well as <|eot_id|>.
    """
    ids: list[int] = []
    configured: int | list[int] | None = None
    if model is not None:
        if model.generation_config is not None:
            configured = model.generation_config.eos_token_id
    else:
        folder = Path(model_dir if model_dir is not None else tokenizer.name_or_path or "")
        saved = folder / GENERATION_CONFIG_NAME
        configured = GenerationConfig.from_pretrained(folder).eos_token_id if saved.is_file() else None
    for value in (configured, tokenizer.eos_token_id):
        if value is None:
            continue
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token not in ids:
                ids.append(int(token))
    return ids


class HFBackend(StepBackend):
    """A `transformers` causal LM as a step backend of `RolloutEngine`."""

    supports_constraints = True

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        logits_processors: Sequence[LogitsProcessor] = (),
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_ids or [0])[0])
        self.logits_processors = list(logits_processors)
        self.autocast_dtype = autocast_dtype
        self.device = next(model.parameters()).device

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @torch.no_grad()
    def generate(self, driver: StepDriver, rows: list[RowState], sampling: SamplingParams) -> None:
        """Run every row to its finish, calling back into the engine per token (`StepBackend.generate`)."""
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        was_training = self.model.training
        self.model.eval()  # type: ignore[no-untyped-call]  # no dropout while sampling; mode restored below
        try:
            self._generate(driver, rows, sampling, generator)
        finally:
            self.model.train(was_training)

    def _generate(
        self, engine: StepDriver, rows: list[RowState], sampling: SamplingParams, generator: torch.Generator | None
    ) -> None:
        with self._autocast():
            state = _Batch(self, rows)
            logits = state.prefill()
            while True:
                tokens, logprobs = self._sample(engine, state.rows, logits, sampling, generator)
                token_list, logprob_list = tokens.tolist(), logprobs.tolist()
                waiting = []
                for i, row in enumerate(state.rows):
                    if not row.finished and engine.accept(row, token_list[i], logprob_list[i]):
                        waiting.append(row)
                inserted = engine.run_tools(waiting) if waiting else {}
                if all(row.finished for row in state.rows):
                    return
                keep = state.repack_if_useful(engine.config.compact_slack)
                if keep is not None:
                    tokens = tokens[keep]
                logits = state.decode(tokens)
                if inserted:
                    state.insert(inserted, logits)

    def _sample(
        self,
        engine: StepDriver,
        rows: list[RowState],
        logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.float()
        for processor in self.logits_processors:
            logits = processor(rows, logits)
        for i, row in enumerate(rows):
            allowed = None if row.finished else engine.allowed_tokens(row)
            if allowed:
                mask = torch.full_like(logits[i], float("-inf"))
                mask[allowed] = 0.0
                logits[i] = logits[i] + mask
        if sampling.temperature == 0:
            tokens = logits.argmax(dim=-1)
            logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
            return tokens, logprobs
        scaled = logits / sampling.temperature
        all_logprobs = torch.log_softmax(scaled, dim=-1)
        filtered = _top_k_top_p(scaled, sampling.top_k, sampling.top_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]
        return tokens, all_logprobs.gather(1, tokens[:, None])[:, 0]


def _top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the token crossing top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    return logits


class _BufferedLayer(DynamicLayer):  # type: ignore[no-untyped-call]  # transformers' __init_subclass__
    """A cache layer whose keys/values sit in a buffer with spare columns.

    `DynamicLayer.update` concatenates, i.e. copies the whole cache at every decoded token
    (40% of the engine's time at batch 64 with 1k-token rows); here a token is written in place
    and the buffer grows by half its length when full. `keys`/`values` are views of the filled part.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.set(keys, values)

    def set(self, keys: torch.Tensor, values: torch.Tensor, extra: int = 0) -> None:
        """Replace the contents (a new batch or new column layout) with room to grow."""
        batch, heads, length, dim = keys.shape
        capacity = length + extra + max(MIN_SPARE_COLUMNS, length // 2)
        self._keys = keys.new_zeros((batch, heads, capacity, dim))
        self._values = values.new_zeros((batch, heads, capacity, values.shape[3]))
        self._keys[:, :, :length] = keys
        self._values[:, :, :length] = values
        self._view(length)

    def _view(self, length: int) -> None:
        self.length = length
        self.keys, self.values = self.filled()

    def filled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`keys` and `values`: views of the filled columns."""
        return self._keys[:, :, : self.length], self._values[:, :, : self.length]

    def _reserve(self, columns: int) -> None:
        if self.length + columns > self._keys.shape[2]:
            self.set(*self.filled(), extra=columns)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        columns = key_states.shape[2]
        self._reserve(columns)
        self._keys[:, :, self.length : self.length + columns] = key_states
        self._values[:, :, self.length : self.length + columns] = value_states
        self._view(self.length + columns)
        return self.filled()

    def append_rows(self, select: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append columns holding `keys`/`values` for rows `select` and zeros (masked) for others."""
        columns = keys.shape[2]
        self._reserve(columns)
        end = self.length + columns
        self._keys[:, :, self.length : end] = 0  # finite values: a masked column must not carry NaN
        self._values[:, :, self.length : end] = 0
        self._keys[select, :, self.length : end] = keys.to(self._keys.dtype)
        self._values[select, :, self.length : end] = values.to(self._values.dtype)
        self._view(end)


class _Batch:
    """The live rows with their shared KV cache, attention mask and next positions."""

    def __init__(self, backend: HFBackend, rows: list[RowState]) -> None:
        self.backend = backend
        self.model = backend.model
        self.rows = list(rows)
        self.cache = DynamicCache()
        device = backend.device
        self.attention = torch.zeros((len(self.rows), 0), dtype=torch.long, device=device)
        """[rows, columns]: 1 where a row's cache column holds one of its tokens (set by `prefill`)."""
        self.next_position = torch.zeros(len(self.rows), dtype=torch.long, device=device)
        """[rows]: the position of each row's next token."""

    @property
    def layers(self) -> list[_BufferedLayer]:
        """The cache's layers, buffered since the first forward (`_buffer_layers`)."""
        layers = [layer for layer in self.cache.layers if isinstance(layer, _BufferedLayer)]
        if len(layers) != len(self.cache.layers):
            raise RuntimeError("the rollout cache holds an unbuffered layer: prefill has not run")
        return layers

    def _forward(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def prefill(self) -> torch.Tensor:
        """Run each row's prompt and what its completion already holds (a given prefix, see the engine).
        A start shared by every row (the system prompt; the whole prompt for GRPO's repeated
        generations) is computed once and its cache broadcast to all rows; the rest of each row
        follows, left-padded, with holes masked as everywhere else."""
        device, pad = self.backend.device, self.backend.pad_token_id
        batch = len(self.rows)
        starts = [row.prompt_ids + row.completion_ids for row in self.rows]
        shared = _common_prefix(starts)
        if batch == 1 or shared < MIN_SHARED_PREFIX:
            shared = 0
        if shared:
            prefix = torch.tensor([starts[0][:shared]], dtype=torch.long, device=device)
            ones = torch.ones_like(prefix)
            self._forward(prefix, ones, (ones.cumsum(dim=1) - 1), self.cache)
            self._buffer_layers(batch)
        width = max(len(start) for start in starts) - shared
        ids = torch.full((batch, width), pad, dtype=torch.long, device=device)
        attention = torch.zeros((batch, shared + width), dtype=torch.long, device=device)
        attention[:, :shared] = 1
        for i, start in enumerate(starts):
            rest = start[shared:]
            ids[i, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            attention[i, shared + width - len(rest) :] = 1
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)[:, shared:]
        logits = self._forward(ids, attention, positions, self.cache)
        if not shared:
            self._buffer_layers(batch)
        self.attention, self.next_position = attention, attention.sum(dim=1)
        return logits

    def _buffer_layers(self, batch: int) -> None:
        """Swap the plain layers the first forward created for buffered ones (broadcast to `batch`)."""
        for i, layer in enumerate(self.cache.layers):
            if type(layer) is not DynamicLayer or not isinstance(layer, DynamicLayer):
                raise ValueError(
                    f"the hf rollout backend supports full-attention layers only, got {type(layer).__name__}"
                )
            keys, values = _filled(layer)
            self.cache.layers[i] = _BufferedLayer(keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1))

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed each row's sampled token (finished rows feed a masked pad)."""
        live = torch.tensor([not row.finished for row in self.rows], dtype=torch.long, device=tokens.device)
        tokens = torch.where(live.bool(), tokens, torch.full_like(tokens, self.backend.pad_token_id))
        self.attention = torch.cat([self.attention, live[:, None]], dim=1)
        logits = self._forward(tokens[:, None], self.attention, self.next_position[:, None], self.cache)
        self.next_position = self.next_position + live
        return logits

    def insert(self, inserted: dict[int, list[int]], logits: torch.Tensor) -> None:
        """Run the tool blocks of the rows in `inserted` (by row index); overwrite their logits."""
        where = {row.index: i for i, row in enumerate(self.rows)}
        members = [(where[index], ids) for index, ids in inserted.items() if ids and index in where]
        if not members:
            return
        device, pad = self.backend.device, self.backend.pad_token_id
        width = max(len(ids) for _, ids in members)
        chunk = torch.full((len(members), width), pad, dtype=torch.long, device=device)
        chunk_mask = torch.zeros((len(members), width), dtype=torch.long, device=device)
        for j, (_, ids) in enumerate(members):
            chunk[j, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            chunk_mask[j, width - len(ids) :] = 1
        select = torch.tensor([i for i, _ in members], dtype=torch.long, device=device)
        start = self.next_position[select]
        positions = (start[:, None] + chunk_mask.cumsum(dim=1) - 1).clamp(min=0)
        length = self.attention.shape[1]
        everyone = len(members) == len(self.rows)
        if everyone:  # every row calls: run the block on the shared cache directly
            order = select.argsort()
            chunk, chunk_mask, positions = chunk[order], chunk_mask[order], positions[order]
            self.attention = torch.cat([self.attention, chunk_mask], dim=1)
            logits[:] = self._forward(chunk, self.attention, positions, self.cache)
            self.next_position = self.next_position + chunk_mask.sum(dim=1)
            return
        layers = self.layers
        sub = DynamicCache(ddp_cache_data=[(keys[select], values[select]) for keys, values in map(_filled, layers)])
        sub_attention = torch.cat([self.attention[select], chunk_mask], dim=1)
        logits[select] = self._forward(chunk, sub_attention, positions, sub).to(logits.dtype)
        for layer, sub_layer in zip(layers, sub.layers):
            keys, values = _filled(sub_layer)
            layer.append_rows(select, keys[:, :, length:], values[:, :, length:])
        grown = torch.zeros((len(self.rows), width), dtype=torch.long, device=device)
        grown[select] = chunk_mask
        self.attention = torch.cat([self.attention, grown], dim=1)
        self.next_position = self.next_position + grown.sum(dim=1)

    def repack_if_useful(self, slack: int) -> torch.Tensor | None:
        """Drop finished rows and squeeze out holes when it pays; returns the kept row indices."""
        live = [i for i, row in enumerate(self.rows) if not row.finished]
        dropped = len(self.rows) - len(live)
        real = self.attention.sum(dim=1)
        longest = int(real[live].max()) if live else 0
        holes = self.attention.shape[1] - longest
        if dropped < max(1, len(self.rows) // 4) and holes < slack:
            return None
        keep = torch.tensor(live, dtype=torch.long, device=self.attention.device)
        attention = self.attention[keep]
        # Stable sort puts masked columns first and real ones after, each row's in order.
        order = torch.argsort(attention, dim=1, stable=True)[:, attention.shape[1] - longest :]
        for layer in self.layers:
            keys, values = layer.filled()
            index = order[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
            layer.set(torch.gather(keys[keep], 2, index), torch.gather(values[keep], 2, index))
        self.attention = attention.gather(1, order)
        self.next_position = self.next_position[keep]
        self.rows = [self.rows[i] for i in live]
        return keep


def _filled(layer: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of a full-attention cache layer a forward has filled."""
    if isinstance(layer, _BufferedLayer):
        return layer.filled()
    if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
        raise ValueError(f"the hf rollout backend needs filled key/value cache layers, got {type(layer).__name__}")
    return layer.keys, layer.values


def _common_prefix(sequences: list[list[int]]) -> int:
    """Length of the common prefix, leaving every sequence at least one token of its own."""
    shortest = min(len(s) for s in sequences)
    first = sequences[0]
    n = 0
    while n < shortest - 1 and all(s[n] == first[n] for s in sequences):
        n += 1
    return n
