"""The batching worker of the HTTP service: a bounded queue and one thread that runs batches.

The worker takes the first waiting request, waits `batch_wait` seconds for more, and runs up to
`max_batch_size` requests with the same batch key (limits and sampling settings) as one rollout
batch. Greedy results do not depend on the batch; seeded sampling draws from one generator per
batch, so a sampled answer depends on which requests shared its batch.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kgreasoner.serving.config import ServeConfig
from kgreasoner.serving.validation import AnswerRequest

logger = logging.getLogger(__name__)


class ServiceBusy(RuntimeError):
    """The queue is full or the service is closing (HTTP 503)."""


class Batcher:
    """Queues requests and runs them in batches with `run_batch(requests) -> results` on one worker thread."""

    def __init__(self, config: ServeConfig, run_batch: Callable[[Sequence[AnswerRequest]], list[Any]]) -> None:
        self.config = config
        self._run_batch = run_batch
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[AnswerRequest, concurrent.futures.Future]] = collections.deque()
        self._worker: threading.Thread | None = None
        self._closed = False

    def submit(self, request: AnswerRequest) -> concurrent.futures.Future:
        """Queue a request; the future gives what `run_batch` returned for it."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise ServiceBusy("the service is shutting down")
            if len(self._queue) >= self.config.max_queue:
                raise ServiceBusy(f"{len(self._queue)} requests are waiting (max_queue); retry later")
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="kgreasoner-batcher", daemon=True)
                self._worker.start()
            self._queue.append((request, future))
            self._cond.notify()
        return future

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self) -> None:
        """Stop the worker (after the batch it is running) and fail the queued requests."""
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for _, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(ServiceBusy("the service shut down before this request ran"))
        if self._worker is not None:
            self._worker.join()
            self._worker = None

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                end = time.monotonic() + self.config.batch_wait
                while len(self._queue) < self.config.max_batch_size and not self._closed:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._take_batch()
            live = [(request, future) for request, future in batch if future.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                results = self._run_batch([request for request, _ in live])
            except Exception as err:  # a model/backend crash fails this batch, not the service
                logger.exception("rollout batch of %d requests failed", len(live))
                for _, future in live:
                    future.set_exception(err)
                continue
            for (_, future), answered in zip(live, results):
                future.set_result(answered)

    def _take_batch(self) -> list[tuple[AnswerRequest, concurrent.futures.Future]]:
        """The oldest request and the next ones with the same batch key, up to max_batch_size."""
        first = self._queue.popleft()
        batch = [first]
        rest: collections.deque[tuple[AnswerRequest, concurrent.futures.Future]] = collections.deque()
        while self._queue:
            item = self._queue.popleft()
            if len(batch) < self.config.max_batch_size and item[0].batch_key == first[0].batch_key:
                batch.append(item)
            else:
                rest.append(item)
        self._queue.extend(rest)
        return batch
