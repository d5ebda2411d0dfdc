"""Deterministic simulated content: videos, their media bytes, subtitles and summaries.

Everything is derived from a seed string, so two runs (and two processes) see the
same catalog: ``video(domain, video_id, version)`` always returns the same title,
sizes and subtitles. The "model" is not a model: :func:`extract` is a tiny extractive
summarizer (sentence scoring by word frequency) that the simulated provider and the
service's last-resort fallback both use. No language model is involved anywhere.

Example::

    >>> v = video("vidhub.test", "abc123", 1)
    >>> v.video_size > 0 and v.subtitles.startswith("WEBVTT")
    True
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass

__all__ = [
    "BLOCK",
    "DOMAINS",
    "Video",
    "extract",
    "media_bytes",
    "segment",
    "sentences_of",
    "subtitle_text",
    "video",
]

#: The simulated platforms, served by :mod:`integrations.summarizer.platforms`.
DOMAINS: tuple[str, ...] = ("vidhub.test", "streamly.test", "clipzone.test", "tubeverse.test")

#: Media bytes are generated in blocks of this size, so any byte range is cheap to serve.
BLOCK = 16384

_TOPICS: dict[str, tuple[str, ...]] = {
    "rust": ("borrow", "checker", "lifetimes", "compiler", "traits", "ownership", "crates"),
    "cooking": ("dough", "oven", "butter", "flour", "knead", "crust", "yeast"),
    "climbing": ("rope", "belay", "anchor", "crimp", "route", "chalk", "harness"),
    "finance": ("budget", "interest", "index", "fund", "savings", "inflation", "bonds"),
    "astronomy": ("telescope", "orbit", "nebula", "galaxy", "comet", "eclipse", "lens"),
    "gardening": ("compost", "seedling", "soil", "mulch", "prune", "tomato", "water"),
}
_VERBS = ("explains", "shows", "compares", "tests", "builds", "reviews", "fixes", "measures")
_ADJ = ("simple", "careful", "fast", "cheap", "robust", "common", "surprising", "classic")
_FILLER = ("the", "a", "every", "this", "our", "one", "that")
_TAIL = (
    "before the next step",
    "with a few mistakes along the way",
    "and why it matters",
    "in under a minute",
    "for beginners",
    "using only basic tools",
    "with measurements on screen",
)


@dataclass(frozen=True, slots=True)
class Video:
    """One simulated video: its metadata and the sizes of its media.

    Example::

        v = video("streamly.test", "xyz", 2)
        v.etag        # '"streamly.test-xyz-v2"'
    """

    domain: str
    video_id: str
    version: int
    title: str
    topic: str
    description: str
    duration_s: int
    video_size: int
    audio_size: int
    subtitles: str

    @property
    def etag(self) -> str:
        """The strong entity tag of every representation of this version."""
        return f'"{self.domain}-{self.video_id}-v{self.version}"'

    def size_of(self, kind: str) -> int:
        """Size in bytes of ``kind`` (``video``, ``audio`` or ``subtitles``)."""
        if kind == "video":
            return self.video_size
        if kind == "audio":
            return self.audio_size
        return len(self.subtitles.encode())

    def metadata(self) -> dict[str, object]:
        """The JSON document served by the metadata endpoint."""
        return {
            "id": self.video_id,
            "domain": self.domain,
            "version": self.version,
            "etag": self.etag,
            "title": self.title,
            "topic": self.topic,
            "description": self.description,
            "duration_s": self.duration_s,
            "media": {
                "video": {"path": f"/media/{self.video_id}/video", "size": self.video_size},
                "audio": {"path": f"/media/{self.video_id}/audio", "size": self.audio_size},
                "subtitles": {
                    "path": f"/media/{self.video_id}/subtitles",
                    "size": self.size_of("subtitles"),
                },
            },
        }


def _sentence(rng: random.Random, topic: str) -> str:
    words = _TOPICS[topic]
    a, b = rng.sample(words, 2)
    return (
        f"{rng.choice(_FILLER).capitalize()} {rng.choice(_ADJ)} {a} "
        f"{rng.choice(_VERBS)} {rng.choice(_FILLER)} {b} {rng.choice(_TAIL)}."
    )


@functools.lru_cache(maxsize=4096)
def video(
    domain: str,
    video_id: str,
    version: int = 1,
    *,
    video_kb: tuple[int, int] = (160, 320),
    audio_kb: tuple[int, int] = (48, 96),
    sentences: tuple[int, int] = (8, 60),
) -> Video:
    """The simulated video ``video_id`` of ``domain`` at ``version`` (deterministic).

    Sizes are drawn from the ``*_kb`` ranges and the subtitle length (in sentences)
    from ``sentences``; the same arguments always give the same video.

    Example::

        >>> video("vidhub.test", "a1").title == video("vidhub.test", "a1").title
        True
    """
    rng = random.Random(f"{domain}/{video_id}/{version}")
    topic = rng.choice(sorted(_TOPICS))
    n = rng.randint(*sentences)
    lines = [_sentence(rng, topic) for _ in range(n)]
    cues = ["WEBVTT", ""]
    t = 0.0
    for i, line in enumerate(lines):
        d = 2.0 + rng.random() * 3.0
        cues += [str(i + 1), f"{_ts(t)} --> {_ts(t + d)}", line, ""]
        t += d
    title = (
        f"{rng.choice(_ADJ).capitalize()} {topic}: {rng.choice(_TOPICS[topic])} {rng.choice(_TAIL)}"
    )
    return Video(
        domain=domain,
        video_id=video_id,
        version=version,
        title=title,
        topic=topic,
        description=" ".join(lines[:2]),
        duration_s=int(t),
        video_size=rng.randint(video_kb[0] * 1024, video_kb[1] * 1024),
        audio_size=rng.randint(audio_kb[0] * 1024, audio_kb[1] * 1024),
        subtitles="\n".join(cues),
    )


def _ts(seconds: float) -> str:
    ms = int(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"


def _block(seed: bytes, index: int) -> bytes:
    return random.Random(seed + index.to_bytes(8, "big")).randbytes(BLOCK)


def media_bytes(v: Video, kind: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the ``kind`` representation of ``v`` (deterministic).

    Video and audio are pseudo-random blocks derived from the video's identity, so a
    resumed download can be checked byte for byte against a complete one.

    Example::

        >>> v = video("vidhub.test", "a1")
        >>> media_bytes(v, "audio", 10, 20) == media_bytes(v, "audio", 0, 40)[10:20]
        True
    """
    if kind == "subtitles":
        return v.subtitles.encode()[start:end]
    seed = hashlib.blake2b(f"{v.etag}/{kind}".encode(), digest_size=16).digest()
    first, last = start // BLOCK, (end - 1) // BLOCK
    data = b"".join(_block(seed, i) for i in range(first, last + 1))
    offset = first * BLOCK
    return data[start - offset : end - offset]


_CUE_LINE = re.compile(r"^(WEBVTT|\d+|\d\d:\d\d:\d\d\.\d{3} --> .*)?$")


def subtitle_text(vtt: str) -> str:
    """The spoken text of a WebVTT document (cue numbers and timings removed).

    Example::

        >>> subtitle_text("WEBVTT\\n\\n1\\n00:00:00.000 --> 00:00:02.000\\nHello there.\\n")
        'Hello there.'
    """
    return " ".join(line.strip() for line in vtt.splitlines() if not _CUE_LINE.match(line.strip()))


_SPLIT = re.compile(r"(?<=[.!?])\s+")


def sentences_of(text: str) -> list[str]:
    """Split ``text`` into sentences (on ``.``, ``!`` and ``?``)."""
    return [s for s in _SPLIT.split(text.strip()) if s]


def segment(text: str, parts: int = 5) -> list[str]:
    """Split ``text`` into at most ``parts`` contiguous segments of similar word counts.

    Sentences are never cut; a text of fewer sentences than ``parts`` gives one
    segment per sentence.

    Example::

        >>> segment("A b. C d. E f.", parts=2)
        ['A b. C d.', 'E f.']
    """
    sents = sentences_of(text)
    if not sents:
        return []
    total = sum(len(s.split()) for s in sents)
    target = total / min(parts, len(sents))
    out: list[list[str]] = [[]]
    count = 0
    for s in sents:
        if out[-1] and count >= target * len(out) and len(out) < parts:
            out.append([])
        out[-1].append(s)
        count += len(s.split())
    return [" ".join(chunk) for chunk in out]


_STOP = frozenset(_FILLER) | frozenset({"and", "with", "for", "in", "of", "to", "it", "why"})


def extract(text: str, sentences: int = 1) -> str:
    """A deterministic extractive summary: the ``sentences`` highest-scoring sentences.

    Each sentence scores the mean corpus frequency of its content words; the chosen
    ones keep their original order. This is the whole "model" of the demo.

    Example::

        >>> extract("Dough needs flour. The oven is hot. Flour and dough make bread.", 1)
        'Dough needs flour.'
    """
    sents = sentences_of(text)
    if len(sents) <= sentences:
        return " ".join(sents)
    freq: dict[str, int] = {}
    tokenized = []
    for s in sents:
        words = [w.strip(".,!?").lower() for w in s.split()]
        words = [w for w in words if w and w not in _STOP]
        tokenized.append(words)
        for w in words:
            freq[w] = freq.get(w, 0) + 1
    scores = [
        (sum(freq[w] for w in words) / (len(words) or 1), -i) for i, words in enumerate(tokenized)
    ]
    best = sorted(range(len(sents)), key=lambda i: scores[i], reverse=True)[:sentences]
    return " ".join(sents[i] for i in sorted(best))
