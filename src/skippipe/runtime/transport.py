"""Point-to-point messages between workers: a fixed int64 header, then one tensor. Never pickled.

Header (``HEADER_LEN`` int64 values)::

    [iteration, microbatch id, direction, dtype code, sent_us, ndim, wire code, shape[0], ..., shape[MAX_NDIM-1]]

Float tensors travel in the transport's wire format (``wire.py``: fp32, bf16, or int8 with row
scales, optionally with error feedback per stream); the receiver decodes them to float32. The
header carries the tensor's own dtype and shape; the payload's follow from the wire code.

A receiver thread takes headers from *any* peer (gloo ``recv`` with no source), checks each
header against ``MessageBounds`` (what the plan says a message of this run can be: the
microbatch ids, one activation shape, a few float dtypes) *before* it allocates anything, then
takes the payload from the peer that sent that header; messages between one pair of workers
arrive in order. Headers always travel on a gloo group; payloads travel on the payload group
(gloo with CPU tensors, or NCCL with CUDA tensors), or on the pair's own directed group when
``links`` has one (always with NCCL: see ``process_group`` for the deadlock this avoids). A sender thread delivers each message at
its due time (``emulation.LinkDelays``), so a slow emulated link never blocks compute.

Every wait has a timeout. Failures are typed (``skippipe.errors``): ``PeerLost(peer)`` when a
connection breaks, ``MessageTimeout`` when nothing arrives in time, ``BadMessage(peer)`` for a
header outside the bounds; an error in either thread is re-raised in the worker's main thread.
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

from skippipe.costs import WIRE_FORMATS
from skippipe.errors import BadMessage, MessageTimeout, PeerLost
from skippipe.runtime.faults import first_line
from skippipe.runtime.wire import ErrorFeedback, decode, encode, payload_shape

FORWARD = 0  # an activation travelling along the microbatch's path
BACKWARD = 1  # a gradient travelling along the reverse path

MAX_NDIM = 6
HEADER_LEN = 7 + MAX_NDIM
HEADER_TAG = 11
PAYLOAD_TAG = 12

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
WIRES = list(WIRE_FORMATS)  # wire code = position


@dataclass(frozen=True)
class MessageBounds:
    """What an incoming message may be, from the plan and the run's model: every activation and
    gradient is one ``shape`` tensor (samples per microbatch x tokens per sample x d_model) of
    one of ``dtypes``, for one of the plan's ``microbatches``. A header outside is refused before
    anything is allocated."""

    shape: tuple[int, ...]
    microbatches: frozenset[int]
    dtypes: frozenset[torch.dtype] = FLOAT_DTYPES


@dataclass
class Message:
    iteration: int
    mb: int
    direction: int
    tensor: torch.Tensor
    src: int = -1
    sent_at: float = 0.0  # wall clock when the sender handed it over
    arrived_at: float = 0.0  # wall clock when the payload was here
    wire: str = "fp32"  # how ``tensor`` travels (set by the sender)


def encode_header(msg: Message) -> torch.Tensor:
    """The header of ``msg`` (whose ``tensor`` is still the tensor itself, not its payload)."""
    t = msg.tensor
    if t.dim() > MAX_NDIM:
        raise ValueError(f"tensor has {t.dim()} dimensions; at most {MAX_NDIM} can be sent")
    if t.dtype not in _CODE:
        raise ValueError(f"dtype {t.dtype} cannot be sent")
    shape = list(t.shape) + [0] * (MAX_NDIM - t.dim())
    sent_us = int(msg.sent_at * 1e6)
    wire = WIRES.index(msg.wire) if t.is_floating_point() else 0
    return torch.tensor(
        [msg.iteration, msg.mb, msg.direction, _CODE[t.dtype], sent_us, t.dim(), wire, *shape], dtype=torch.int64
    )


def decode_header(
    h: torch.Tensor, bounds: MessageBounds | None = None, src: int | None = None
) -> tuple[int, int, int, torch.dtype, float, list[int], str]:
    """The fields of a header; ``BadMessage(src)`` for a corrupt one or, with ``bounds``, for one
    the plan does not allow (checked before anything is allocated: the payload's size follows
    from the tensor's shape and the wire format)."""
    v = h.tolist()
    iteration, mb, direction, code, sent_us, ndim, wire = v[:7]
    bad = not 0 <= code < len(_DTYPES) or not 0 <= ndim <= MAX_NDIM or not 0 <= wire < len(WIRES)
    if direction not in (FORWARD, BACKWARD) or bad:
        raise BadMessage(src, f"corrupt message header {v}")
    dtype, shape = _DTYPES[code], v[7 : 7 + ndim]
    if bounds is not None:
        if tuple(shape) != bounds.shape:
            raise BadMessage(src, f"a tensor of shape {shape}; this run's messages are {list(bounds.shape)}")
        if dtype not in bounds.dtypes:
            raise BadMessage(src, f"a tensor of dtype {dtype}; allowed: {', '.join(sorted(str(d) for d in bounds.dtypes))}")
        if mb not in bounds.microbatches:
            raise BadMessage(src, f"microbatch {mb} is not in the plan")
        if iteration < 0:
            raise BadMessage(src, f"iteration {iteration}")
    return iteration, mb, direction, dtype, sent_us / 1e6, shape, WIRES[wire]


def payload_of(dtype: torch.dtype, shape: list[int], wire: str) -> tuple[torch.dtype, list[int]]:
    """dtype and shape of the payload that carries a tensor of ``dtype`` and ``shape``."""
    if not dtype.is_floating_point or wire == "fp32":
        return dtype, shape
    return (torch.bfloat16 if wire == "bf16" else torch.uint8), payload_shape(wire, shape)


def _on_host(group: dist.ProcessGroup) -> bool:
    """Payloads of a gloo group travel from host memory (gloo sends CPU tensors only)."""
    return dist.get_backend(group) == "gloo"


def _source_rank(work: dist.Work) -> int:
    fn = getattr(work, "_source_rank", None) or work.source_rank
    return int(fn())


class Transport:
    """Sends and receives ``Message``s for one worker.

    ``delay(dst) -> seconds`` gives each message's emulated delivery delay (0 on real clusters).
    ``on_sent(dst, msg, handed_over, delivered)`` is called from the sender thread after a send.
    ``bounds``: what incoming messages may be (None: anything well-formed, for tests).
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
        bounds: MessageBounds | None = None,
        wire: str = "fp32",
        error_feedback: bool = False,
        links: dict[tuple[int, int], dist.ProcessGroup] | None = None,
    ) -> None:
        self.rank = rank
        self.header_group = header_group
        self.payload_group = payload_group
        self.links = links or {}  # (src, dst) -> the group for payloads src -> dst (process_group.make_groups)
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.delay = delay or (lambda dst: 0.0)
        self.on_sent = on_sent
        self.bounds = bounds
        self.wire = wire
        self.feedback = ErrorFeedback(wire) if error_feedback and wire != "fp32" else None
        self.inbox: queue.Queue[Message | BaseException] = queue.Queue()
        self._heap: list[tuple[float, int, int, Message]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self._unsent = 0
        self._sending_to: int | None = None
        self._error: BaseException | None = None
        self._sender = threading.Thread(target=self._send_loop, name=f"send-{rank}", daemon=True)
        self._sender.start()
        self._receiver: threading.Thread | None = None

    def _wait(self, work: dist.Work, peer: int | None, what: str) -> None:
        """``work.wait`` with the run's timeout; a failure becomes ``MessageTimeout`` (it took
        the whole timeout) or ``PeerLost`` (the connection broke)."""
        t0 = time.monotonic()
        try:
            work.wait(self.timeout)
        except RuntimeError as exc:
            waited = time.monotonic() - t0
            if waited >= 0.9 * self.timeout_s:
                raise MessageTimeout(() if peer is None else (peer,), self.timeout_s, f"no {what} arrived") from None
            raise PeerLost(peer, f"{what}: {first_line(exc, 200)}") from None

    # ------------------------------------------------------------------ sending
    def send(self, dst: int, msg: Message) -> None:
        """Queue ``msg`` for ``dst``; it is transmitted once its emulated delay has passed."""
        self.raise_if_failed()
        msg.sent_at = time.time()
        if msg.tensor.requires_grad:
            msg.tensor = msg.tensor.detach()
        msg.wire = self.wire
        due = time.monotonic() + max(0.0, self.delay(dst))
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), dst, msg))
            self._unsent += 1
            self._cond.notify()

    def _send_loop(self) -> None:
        dst = -1
        try:
            while True:
                with self._cond:
                    while True:
                        if self._closing and not self._heap:
                            return
                        if self._heap and self._heap[0][0] <= time.monotonic():
                            _, _, dst, msg = heapq.heappop(self._heap)
                            self._sending_to = dst
                            break
                        wait = self._heap[0][0] - time.monotonic() if self._heap else None
                        self._cond.wait(wait)
                handed_over = time.time()
                header = encode_header(msg)
                if self.feedback is not None:
                    payload = self.feedback.encode((dst, msg.direction, msg.mb), msg.tensor)
                else:
                    payload = encode(msg.tensor, msg.wire)
                payload = payload.contiguous()
                group = self.links.get((self.rank, dst), self.payload_group)
                payload = payload.cpu() if _on_host(group) else payload.to(self.device)
                dist.send(header, dst, group=self.header_group, tag=HEADER_TAG)
                dist.send(payload, dst, group=group, tag=PAYLOAD_TAG)
                if self.on_sent is not None:
                    self.on_sent(dst, msg, handed_over, time.time())
                with self._cond:
                    self._unsent -= 1
                    self._sending_to = None
                    self._cond.notify_all()
        except BaseException as exc:  # reported to the main thread
            self._fail(PeerLost(dst, f"sending failed: {first_line(exc, 200)}"))

    def _fail(self, err: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = err
            self._cond.notify_all()
        self.inbox.put(err)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued message has been handed to the network."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        with self._cond:
            while self._unsent and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    stuck = () if self._sending_to is None else (self._sending_to,)
                    raise MessageTimeout(stuck, limit, f"{self._unsent} message(s) could not be sent")
                self._cond.wait(min(left, 0.5))
        self.raise_if_failed()

    # ------------------------------------------------------------------ receiving
    def expect(self, count: int) -> None:
        """Start a receiver thread that takes exactly ``count`` messages into ``inbox``."""
        if self._receiver is not None:
            self._receiver.join(timeout=self.timeout_s)
            if self._receiver.is_alive():
                raise MessageTimeout((), self.timeout_s, "the previous iteration's receiver is still waiting")
        self._receiver = threading.Thread(target=self._recv_loop, args=(count,), name=f"recv-{self.rank}", daemon=True)
        self._receiver.start()

    def _recv_loop(self, count: int) -> None:
        try:
            for _ in range(count):
                h = torch.empty(HEADER_LEN, dtype=torch.int64)
                work = dist.irecv(h, group=self.header_group, tag=HEADER_TAG)
                self._wait(work, None, "message")
                src = _source_rank(work)
                iteration, mb, direction, dtype, sent_at, shape, wire = decode_header(h, self.bounds, src)
                group = self.links.get((src, self.rank), self.payload_group)
                device = torch.device("cpu") if _on_host(group) else self.device
                p_dtype, p_shape = payload_of(dtype, shape, wire)
                t = torch.empty(p_shape, dtype=p_dtype, device=device)
                work = dist.irecv(t, src=src, group=group, tag=PAYLOAD_TAG)
                self._wait(work, src, "payload")
                if dtype.is_floating_point:
                    t = decode(t, wire, shape).to(dtype)
                t = t.to(self.device)
                self.inbox.put(Message(iteration, mb, direction, t, src=src, sent_at=sent_at, arrived_at=time.time()))
        except (PeerLost, MessageTimeout, BadMessage) as exc:
            self._fail(exc)
        except BaseException as exc:
            self._fail(PeerLost(None, f"receiving failed: {first_line(exc, 200)}"))

    def get(self, timeout_s: float | None) -> Message | None:
        """The next received message, or None after ``timeout_s`` (None = wait up to the run
        timeout, then ``MessageTimeout``)."""
        try:
            item = self.inbox.get(timeout=self.timeout_s if timeout_s is None else max(0.0, timeout_s))
        except queue.Empty:
            if timeout_s is None:
                raise MessageTimeout((), self.timeout_s, "no message arrived") from None
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
