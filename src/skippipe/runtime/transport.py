"""Point-to-point messages between workers: a fixed int64 header, then one tensor. Never pickled.

Header (``HEADER_LEN`` int64 values)::

    [iteration, microbatch id, direction, dtype code, sent_us, ndim, shape[0], ..., shape[MAX_NDIM-1]]

A receiver thread takes headers from *any* peer (gloo ``recv`` with no source), then the payload
from the peer that sent that header; messages between one pair of workers arrive in order.
Headers always travel on a gloo group; payloads travel on the payload group (gloo with CPU
tensors, or NCCL with CUDA tensors). A sender thread delivers each message at its due time
(``emulation.LinkDelays``), so a slow emulated link never blocks compute.

Every wait has a timeout; an error in either thread is re-raised in the worker's main thread.
"""

from __future__ import annotations

import datetime
import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

FORWARD = 0  # an activation travelling along the microbatch's path
BACKWARD = 1  # a gradient travelling along the reverse path

MAX_NDIM = 6
HEADER_LEN = 6 + MAX_NDIM
HEADER_TAG = 11
PAYLOAD_TAG = 12

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}


class TransportError(RuntimeError):
    """A message could not be sent or did not arrive in time (a peer died or hangs)."""


@dataclass
class Message:
    iteration: int
    mb: int
    direction: int
    tensor: torch.Tensor
    src: int = -1
    sent_at: float = 0.0  # wall clock when the sender handed it over
    arrived_at: float = 0.0  # wall clock when the payload was here


def encode_header(msg: Message) -> torch.Tensor:
    t = msg.tensor
    if t.dim() > MAX_NDIM:
        raise ValueError(f"tensor has {t.dim()} dimensions; at most {MAX_NDIM} can be sent")
    if t.dtype not in _CODE:
        raise ValueError(f"dtype {t.dtype} cannot be sent")
    shape = list(t.shape) + [0] * (MAX_NDIM - t.dim())
    sent_us = int(msg.sent_at * 1e6)
    return torch.tensor([msg.iteration, msg.mb, msg.direction, _CODE[t.dtype], sent_us, t.dim(), *shape], dtype=torch.int64)


def decode_header(h: torch.Tensor) -> tuple[int, int, int, torch.dtype, float, list[int]]:
    v = h.tolist()
    iteration, mb, direction, code, sent_us, ndim = v[:6]
    if direction not in (FORWARD, BACKWARD) or not 0 <= code < len(_DTYPES) or not 0 <= ndim <= MAX_NDIM:
        raise TransportError(f"corrupt message header {v}")
    return iteration, mb, direction, _DTYPES[code], sent_us / 1e6, v[6 : 6 + ndim]


def _source_rank(work: dist.Work) -> int:
    fn = getattr(work, "_source_rank", None) or work.source_rank
    return int(fn())


class Transport:
    """Sends and receives ``Message``s for one worker.

    ``delay(dst) -> seconds`` gives each message's emulated delivery delay (0 on real clusters).
    ``on_sent(dst, msg, handed_over, delivered)`` is called from the sender thread after a send.
    """

    def __init__(
        self,
        rank: int,
        header_group: dist.ProcessGroup,
        payload_group: dist.ProcessGroup,
        device: torch.device,
        timeout_s: float,
        delay: Callable[[int], float] | None = None,
        on_sent: Callable[[int, Message, float, float], None] | None = None,
    ) -> None:
        self.rank = rank
        self.header_group = header_group
        self.payload_group = payload_group
        self.device = device
        self.payload_on_cpu = dist.get_backend(payload_group) == "gloo"
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.delay = delay or (lambda dst: 0.0)
        self.on_sent = on_sent
        self.inbox: queue.Queue[Message | BaseException] = queue.Queue()
        self._heap: list[tuple[float, int, int, Message]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self._unsent = 0
        self._error: BaseException | None = None
        self._sender = threading.Thread(target=self._send_loop, name=f"send-{rank}", daemon=True)
        self._sender.start()
        self._receiver: threading.Thread | None = None

    # ------------------------------------------------------------------ sending
    def send(self, dst: int, msg: Message) -> None:
        """Queue ``msg`` for ``dst``; it is transmitted once its emulated delay has passed."""
        self.raise_if_failed()
        msg.sent_at = time.time()
        if msg.tensor.requires_grad:
            msg.tensor = msg.tensor.detach()
        due = time.monotonic() + max(0.0, self.delay(dst))
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), dst, msg))
            self._unsent += 1
            self._cond.notify()

    def _send_loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while True:
                        if self._closing and not self._heap:
                            return
                        if self._heap and self._heap[0][0] <= time.monotonic():
                            _, _, dst, msg = heapq.heappop(self._heap)
                            break
                        wait = self._heap[0][0] - time.monotonic() if self._heap else None
                        self._cond.wait(wait)
                handed_over = time.time()
                payload = msg.tensor.contiguous()
                payload = payload.cpu() if self.payload_on_cpu else payload.to(self.device)
                dist.send(encode_header(msg), dst, group=self.header_group, tag=HEADER_TAG)
                dist.send(payload, dst, group=self.payload_group, tag=PAYLOAD_TAG)
                if self.on_sent is not None:
                    self.on_sent(dst, msg, handed_over, time.time())
                with self._cond:
                    self._unsent -= 1
                    self._cond.notify_all()
        except BaseException as exc:  # reported to the main thread
            self._error = TransportError(f"sending to node {dst} failed: {_short(exc)}")
            self.inbox.put(self._error)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued message has been handed to the network."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        with self._cond:
            while self._unsent and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportError(f"{self._unsent} message(s) could not be sent within {self.timeout_s:.0f} s")
                self._cond.wait(min(left, 0.5))
        self.raise_if_failed()

    # ------------------------------------------------------------------ receiving
    def expect(self, count: int) -> None:
        """Start a receiver thread that takes exactly ``count`` messages into ``inbox``."""
        if self._receiver is not None:
            self._receiver.join(timeout=self.timeout_s)
            if self._receiver.is_alive():
                raise TransportError("the previous receiver thread is still running")
        self._receiver = threading.Thread(target=self._recv_loop, args=(count,), name=f"recv-{self.rank}", daemon=True)
        self._receiver.start()

    def _recv_loop(self, count: int) -> None:
        try:
            for _ in range(count):
                h = torch.empty(HEADER_LEN, dtype=torch.int64)
                work = dist.irecv(h, group=self.header_group, tag=HEADER_TAG)
                try:
                    work.wait(self.timeout)
                except RuntimeError as exc:
                    if "Timed out" in str(exc):
                        raise TransportError(f"no message arrived for {self.timeout_s:.0f} s") from None
                    raise
                src = _source_rank(work)
                iteration, mb, direction, dtype, sent_at, shape = decode_header(h)
                device = torch.device("cpu") if self.payload_on_cpu else self.device
                t = torch.empty(shape, dtype=dtype, device=device)
                work = dist.irecv(t, src=src, group=self.payload_group, tag=PAYLOAD_TAG)
                work.wait(self.timeout)
                t = t.to(self.device)
                self.inbox.put(Message(iteration, mb, direction, t, src=src, sent_at=sent_at, arrived_at=time.time()))
        except BaseException as exc:
            err = exc if isinstance(exc, TransportError) else TransportError(f"receiving failed: {_short(exc)}")
            self._error = err
            self.inbox.put(err)

    def get(self, timeout_s: float | None) -> Message | None:
        """The next received message, or None after ``timeout_s`` (None = wait up to the run timeout)."""
        try:
            item = self.inbox.get(timeout=self.timeout_s if timeout_s is None else max(0.0, timeout_s))
        except queue.Empty:
            if timeout_s is None:
                raise TransportError(f"no message arrived for {self.timeout_s:.0f} s") from None
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._sender.join(timeout=self.timeout_s)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    if "]" in text and text.startswith("["):  # gloo's "[file:line] message"
        text = text.split("]", 1)[1].strip()
    return text.split(". This is typically caused", 1)[0][:200]
