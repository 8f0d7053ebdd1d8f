"""The batching workers of the HTTP service: a bounded queue and the threads that run its batches.

A worker takes the first waiting request, waits `batch_wait` seconds for more, and runs up to
`batch_size` requests with the same batch key (limits and sampling settings) as one rollout batch.

How many workers, and how large a batch, depend on where the model runs (`AnswerService` chooses):
- in this process (hf, offline vLLM): one worker, batches of `max_batch_size`. One batch at a time
  holds the model; batching is what makes it fast. A row can only be slow by writing many tokens,
  and the engine asks its deadline after every token.
- on a generation server (openai:URL, vllm:URL): `backend_workers` workers, one request each, no
  wait. The server batches concurrent requests itself, so a batch here would only make its rows
  wait for each other's turns: a request whose upstream call stalls would hold every request in
  its batch and every batch queued behind it. Alone, it holds one worker until its deadline.

Greedy results do not depend on the batch; seeded sampling draws from one generator per batch, so
a sampled answer depends on which requests shared its batch (on a generation server it has none).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kgreasoner.serving.validation import AnswerRequest

logger = logging.getLogger(__name__)


class ServiceBusy(RuntimeError):
    """The queue is full or the service is closing (HTTP 503)."""


class Batcher:
    """Queues requests and runs them in batches with `run_batch(requests) -> results` on worker threads.

    `workers` threads each form batches of up to `batch_size` requests, waiting `batch_wait` seconds
    for more after the first, and run them. `detach`: `close` answers the running requests at once
    (ServiceBusy) and does not wait for their workers, which are left to end at their requests'
    deadlines; without it `close` waits for the running batches (they hold an in-process model that
    is freed next).
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[AnswerRequest]], list[Any]],
        max_queue: int,
        batch_size: int,
        batch_wait: float,
        workers: int = 1,
        detach: bool = False,
    ) -> None:
        self._run_batch = run_batch
        self.max_queue, self.batch_size, self.batch_wait = max_queue, batch_size, batch_wait
        self.workers, self.detach = workers, detach
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[AnswerRequest, concurrent.futures.Future]] = collections.deque()
        self._running: set[concurrent.futures.Future] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, request: AnswerRequest) -> concurrent.futures.Future:
        """Queue a request; the future gives what `run_batch` returned for it."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise ServiceBusy("the service is shutting down")
            if len(self._queue) >= self.max_queue:
                raise ServiceBusy(f"{len(self._queue)} requests are waiting (max_queue); retry later")
            if not self._threads:
                for i in range(self.workers):
                    thread = threading.Thread(target=self._serve, name=f"kgreasoner-batcher-{i}", daemon=True)
                    thread.start()
                    self._threads.append(thread)
            self._queue.append((request, future))
            self._cond.notify()
        return future

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self) -> None:
        """Stop the workers and fail the queued requests; the running ones: see the class docstring."""
        with self._cond:
            self._closed = True
            pending = [future for _, future in self._queue]
            self._queue.clear()
            running = list(self._running) if self.detach else []
            threads, self._threads = ([] if self.detach else self._threads), []
            self._cond.notify_all()
        for future in pending:
            if future.set_running_or_notify_cancel():
                self._settle(future, error=ServiceBusy("the service shut down before this request ran"))
        for future in running:
            self._settle(future, error=ServiceBusy("the service shut down while this request was running"))
        for thread in threads:
            thread.join()

    def _settle(self, future: concurrent.futures.Future, result: Any = None, error: Exception | None = None) -> None:
        """Complete a future once: a detached worker may finish a request that `close` already failed."""
        with self._cond:
            self._running.discard(future)
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                end = time.monotonic() + self.batch_wait
                while len(self._queue) < self.batch_size and not self._closed:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if not self._queue:  # another worker took them while this one waited
                    continue
                live = [(r, f) for r, f in self._take_batch() if f.set_running_or_notify_cancel()]
                self._running.update(f for _, f in live)
            if not live:
                continue
            try:
                results = self._run_batch([request for request, _ in live])
            except Exception as err:  # a model/backend crash fails this batch, not the service
                logger.exception("rollout batch of %d requests failed", len(live))
                for _, future in live:
                    self._settle(future, error=err)
                continue
            for (_, future), answered in zip(live, results):
                self._settle(future, result=answered)

    def _take_batch(self) -> list[tuple[AnswerRequest, concurrent.futures.Future]]:
        """The oldest request and the next ones with the same batch key, up to `batch_size`."""
        first = self._queue.popleft()
        batch = [first]
        rest: collections.deque[tuple[AnswerRequest, concurrent.futures.Future]] = collections.deque()
        while self._queue:
            item = self._queue.popleft()
            if len(batch) < self.batch_size and item[0].batch_key == first[0].batch_key:
                batch.append(item)
            else:
                rest.append(item)
        self._queue.extend(rest)
        return batch
