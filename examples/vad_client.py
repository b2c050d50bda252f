"""Find speech in WAV files with the Silero VAD model served by triton-mp (or any Triton).

    python examples/vad_client.py AUDIO.wav [MORE.wav ...] [--url localhost:8001] [--stream]
    python examples/vad_client.py --synthesise demo.wav [--seed 0]

Each file is one *sequence* of the ``silero_vad`` model (``model_repository/silero_vad``,
served with the sequence batcher): its 16 kHz mono samples are sent as 512-sample chunks
(32 ms), all with the file's ``sequence_id``, the first with ``sequence_start`` and the last
with ``sequence_end``; the last chunk is padded with zeros. The server keeps each sequence's
recurrent state, so many files (or live streams) can run at once and each gets its own.
Every answer is the probability that its chunk is speech; Silero's usual hysteresis turns
them into segments: speech starts at a chunk with probability >= ``--threshold`` (0.5), ends
once it stayed below ``threshold - 0.15`` for ``--min-silence-ms`` (100), segments shorter
than ``--min-speech-ms`` (250) are dropped, and each is padded by ``--speech-pad-ms`` (30) on
both sides (Silero's ``get_speech_timestamps`` defaults). It prints one line per segment:

    demo.wav  speech  0.78 s - 2.38 s

Two ways to talk to the server, both as tritonclient's sequence examples do:

- plain ``infer`` calls (the default): one request at a time per file, files in parallel
  threads, one gRPC client each;
- ``--stream``: one bidirectional gRPC stream (``start_stream`` / ``async_stream_infer``)
  carries every file's chunks, interleaved, with up to ``--window`` chunks per file in flight.

``--synthesise OUT.wav`` needs no server: it writes speech-like test audio (formant-synthesised
voiced "utterances" with a falling pitch, syllable rhythm and bursts of frication) separated
by silence, a steady tone and a burst of noise, and prints where the utterances are. Silero
marks the utterances as speech and the tone and noise as not.

**As a library.** ``read_wav`` / ``write_wav``, ``synthesise_speech``, ``split_chunks``,
``speech_segments``, ``infer_probabilities`` and ``stream_probabilities`` are what the tests
use; they need numpy, and the last two ``tritonclient[grpc]``
(``pip install -e '.[examples]'``).
"""

from __future__ import annotations

import argparse
import queue
import random
import sys
import wave
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import tritonclient.grpc as grpcclient

MODEL_NAME = "silero_vad"
INPUT_NAME = "AUDIO"
OUTPUT_NAME = "PROBABILITY"
SAMPLE_RATE_HZ = 16000
"""The model's sample rate; WAV files must have it."""
CHUNK_SAMPLES = 512
"""Samples per request (32 ms at 16 kHz)."""


@dataclass(frozen=True)
class Segment:
    """A stretch of audio, in seconds from the start of the file."""

    start_s: float
    end_s: float


# ---------------------------------------------------------------------------------------------
# Audio files
# ---------------------------------------------------------------------------------------------


def read_wav(path: str | Path) -> np.ndarray:
    """Read a 16 kHz PCM WAV file as mono samples.

    Args:
        path: an uncompressed PCM WAV file, 8, 16, 24 or 32 bits, any number of channels
            (averaged into one).

    Returns:
        FP32 samples in [-1, 1], shape ``[samples]``.

    Raises:
        ValueError: the sample rate is not 16000 Hz or the sample width is not supported.
        wave.Error: the file is not a PCM WAV file.
    """
    with wave.open(str(path), "rb") as f:
        rate, width, channels = f.getframerate(), f.getsampwidth(), f.getnchannels()
        raw = f.readframes(f.getnframes())
    if rate != SAMPLE_RATE_HZ:
        raise ValueError(f"{path}: {rate} Hz; the model wants {SAMPLE_RATE_HZ} Hz (resample it)")
    if width == 1:
        ints = np.frombuffer(raw, np.uint8).astype(np.int32) - 128
    elif width in (2, 4):
        ints = np.frombuffer(raw, np.dtype(f"<i{width}")).astype(np.int64)
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8  # sign-extend 24 bits
    else:
        raise ValueError(f"{path}: {8 * width}-bit samples are not supported")
    full_scale = float(1 << (8 * width - 1))
    samples = ints.reshape(-1, channels).astype(np.float64).mean(axis=1) / full_scale
    return samples.astype(np.float32)


def write_wav(path: str | Path, audio: np.ndarray) -> None:
    """Write mono samples as a 16 kHz 16-bit PCM WAV file.

    Args:
        path: the file to write.
        audio: samples in [-1, 1] (clipped), shape ``[samples]``.
    """
    pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SAMPLE_RATE_HZ)
        f.writeframes(pcm.tobytes())


# ---------------------------------------------------------------------------------------------
# Speech-like test audio
# ---------------------------------------------------------------------------------------------

# Formant frequencies (F1, F2, F3 in Hz) of eight English vowels (Peterson & Barney averages).
_VOWELS_HZ = np.array(
    [
        (730, 1090, 2440),
        (270, 2290, 3010),
        (300, 870, 2240),
        (530, 1840, 2480),
        (660, 1720, 2410),
        (490, 1350, 1690),
        (570, 840, 2410),
        (440, 1020, 2240),
    ],
    dtype=np.float64,
)
_FORMANT_BANDWIDTHS_HZ = np.array([180.0, 220.0, 340.0])
_FORMANT_GAINS = np.array([1.0, 0.8, 0.64])


def synthesise_utterance(duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """One speech-like utterance: voiced syllables with moving formants and frication.

    The voice is a sum of harmonics of a pitch that falls over the utterance (100-160 Hz at
    the start) with a slow wobble; each harmonic's amplitude follows a three-formant
    spectral envelope (falling 6 dB per octave) whose formants glide between vowel targets,
    one per syllable of 120-300 ms; each syllable swells and fades, and most begin with a
    short burst of high-passed noise, like a consonant.

    Args:
        duration_s: its length in seconds.
        rng: the random source (same seed, same audio).

    Returns:
        FP32 samples with peak 0.4, shape ``[round(duration_s * 16000)]``.
    """
    n = int(round(duration_s * SAMPLE_RATE_HZ))
    t = np.arange(n) / SAMPLE_RATE_HZ
    wobble = 1 + 0.08 * np.sin(2 * np.pi * rng.uniform(1, 3) * t)
    f0 = rng.uniform(100, 160) * (1.15 - 0.3 * t / duration_s) * wobble
    formants = np.empty((n, 3))
    loudness = np.empty(n)
    frication = np.zeros(n)
    start, previous = 0, _VOWELS_HZ[rng.integers(len(_VOWELS_HZ))]
    while start < n:
        length = min(int(rng.uniform(0.12, 0.3) * SAMPLE_RATE_HZ), n - start)
        target = _VOWELS_HZ[rng.integers(len(_VOWELS_HZ))]
        glide = np.clip(np.arange(length) / (0.05 * SAMPLE_RATE_HZ), 0, 1)[:, None]
        formants[start : start + length] = previous + (target - previous) * glide
        previous = target
        swell = np.sin(np.pi * np.arange(length) / length)
        loudness[start : start + length] = swell * rng.uniform(0.5, 1.0)
        burst = min(int(rng.uniform(0.02, 0.06) * SAMPLE_RATE_HZ), n - start)
        if rng.random() < 0.6:
            frication[start : start + burst] = np.linspace(rng.uniform(0.2, 0.6), 0, burst)
        start += length
    harmonics = np.arange(1, int(4000 / f0.min()) + 1)[:, None]
    freqs = harmonics * f0[None, :]  # [harmonics, n]
    phases = 2 * np.pi * np.cumsum(freqs, axis=1) / SAMPLE_RATE_HZ
    envelope = np.zeros_like(freqs)
    for k in range(3):
        half_bandwidth = _FORMANT_BANDWIDTHS_HZ[k] / 2
        envelope += _FORMANT_GAINS[k] / (1 + ((freqs - formants[None, :, k]) / half_bandwidth) ** 2)
    envelope *= (freqs < SAMPLE_RATE_HZ / 2 - 200) / harmonics
    voiced = (envelope * np.sin(phases)).sum(axis=0) * loudness
    noise = np.diff(rng.standard_normal(n + 1)) * frication
    x = voiced / np.abs(voiced).max() + 0.3 * noise
    return (0.4 * x / np.abs(x).max()).astype(np.float32)


def synthesise_speech(seed: int = 0) -> tuple[np.ndarray, list[Segment]]:
    """About 11 s of test audio: three utterances between silence, a tone and noise.

    Layout: silence, utterance, silence, a steady 440 Hz tone, silence, utterance, silence,
    white noise, silence, utterance, silence; lengths vary with the seed. A faint noise floor
    (-54 dBFS) runs throughout, so no chunk is digital silence.

    Args:
        seed: the random seed.

    Returns:
        ``(samples, utterances)``: FP32 samples at 16 kHz, shape ``[samples]``, and where the
        three utterances are (the only speech in it).
    """
    rng = np.random.default_rng(seed)

    def silence() -> np.ndarray:
        return np.zeros(int(rng.uniform(0.6, 1.0) * SAMPLE_RATE_HZ), np.float32)

    t = np.arange(int(0.8 * SAMPLE_RATE_HZ)) / SAMPLE_RATE_HZ
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    noise = (0.05 * rng.standard_normal(int(0.8 * SAMPLE_RATE_HZ))).astype(np.float32)
    parts: list[np.ndarray] = [silence()]
    utterances: list[Segment] = []
    for i in range(3):
        begin = sum(len(p) for p in parts)
        utterance = synthesise_utterance(rng.uniform(1.0, 2.0), rng)
        parts.append(utterance)
        utterances.append(
            Segment(begin / SAMPLE_RATE_HZ, (begin + len(utterance)) / SAMPLE_RATE_HZ)
        )
        parts.append(silence())
        if i < 2:
            parts += [(tone, noise)[i], silence()]
    audio = np.concatenate(parts)
    audio += 0.002 * rng.standard_normal(len(audio)).astype(np.float32)
    return audio, utterances


# ---------------------------------------------------------------------------------------------
# Chunks and segments
# ---------------------------------------------------------------------------------------------


def split_chunks(audio: np.ndarray) -> np.ndarray:
    """Cut samples into the model's requests, the last padded with zeros.

    Args:
        audio: FP32 samples at 16 kHz, shape ``[samples]``.

    Returns:
        FP32, shape ``[ceil(samples / 512), 512]`` (at least one row).
    """
    count = max(1, -(-len(audio) // CHUNK_SAMPLES))
    chunks = np.zeros((count, CHUNK_SAMPLES), np.float32)
    chunks.reshape(-1)[: len(audio)] = audio
    return chunks


def speech_segments(
    probabilities: Sequence[float] | np.ndarray,
    total_samples: int,
    *,
    threshold: float = 0.5,
    neg_threshold: float | None = None,
    min_speech_ms: float = 250,
    min_silence_ms: float = 100,
    speech_pad_ms: float = 30,
) -> list[Segment]:
    """Turn per-chunk speech probabilities into speech segments (Silero's hysteresis).

    Speech starts at the first chunk with probability >= ``threshold``. In speech, the first
    chunk below ``neg_threshold`` (default ``max(threshold - 0.15, 0.01)``) marks a possible
    end; a chunk at ``threshold`` or above cancels the mark, and a chunk below
    ``neg_threshold`` at least ``min_silence_ms`` after it confirms it: the segment ends at
    the mark. Segments of ``min_speech_ms`` or less are dropped, one still open at the end of
    the audio ends there, and each is widened by ``speech_pad_ms`` on both sides (neighbours
    closer than twice that share the gap between them).

    Args:
        probabilities: one probability per 512-sample chunk, in order.
        total_samples: the length of the audio in samples (segments never pass it).
        threshold, neg_threshold, min_speech_ms, min_silence_ms, speech_pad_ms: as above.

    Returns:
        The segments in order, in seconds.
    """
    low = max(threshold - 0.15, 0.01) if neg_threshold is None else neg_threshold
    min_speech = SAMPLE_RATE_HZ * min_speech_ms / 1000
    min_silence = SAMPLE_RATE_HZ * min_silence_ms / 1000
    pad = int(SAMPLE_RATE_HZ * speech_pad_ms / 1000)
    spans: list[list[int]] = []
    start: int | None = None
    quiet_from: int | None = None
    for i, p in enumerate(probabilities):
        position = i * CHUNK_SAMPLES
        if start is None:
            if p >= threshold:
                start, quiet_from = position, None
            continue
        if p >= threshold:
            quiet_from = None
        elif p < low:
            if quiet_from is None:
                quiet_from = position
            if position - quiet_from >= min_silence:
                if quiet_from - start > min_speech:
                    spans.append([start, quiet_from])
                start = quiet_from = None
    if start is not None and total_samples - start > min_speech:
        spans.append([start, total_samples])
    for i, span in enumerate(spans):
        if i == 0:
            span[0] = max(0, span[0] - pad)
        if i + 1 < len(spans):
            following = spans[i + 1]
            gap = following[0] - span[1]
            share = gap // 2 if gap < 2 * pad else pad
            span[1] = min(total_samples, span[1] + share)
            following[0] = max(0, following[0] - share)
        else:
            span[1] = min(total_samples, span[1] + pad)
    return [Segment(a / SAMPLE_RATE_HZ, b / SAMPLE_RATE_HZ) for a, b in spans]


# ---------------------------------------------------------------------------------------------
# Talking to the server
# ---------------------------------------------------------------------------------------------


def _chunk_input(chunk: np.ndarray) -> grpcclient.InferInput:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(INPUT_NAME, [1, CHUNK_SAMPLES], "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(chunk, np.float32).reshape(1, -1))
    return tensor


def infer_probabilities(
    client: grpcclient.InferenceServerClient,
    audio: np.ndarray,
    sequence_id: int | str,
    model: str = MODEL_NAME,
) -> np.ndarray:
    """Speech probability of every chunk, one ``infer`` call per chunk, as one sequence.

    Args:
        client: a connected ``tritonclient.grpc`` client.
        audio: FP32 samples at 16 kHz, shape ``[samples]``.
        sequence_id: the sequence's correlation ID (non-zero; unique among live sequences).
        model: the model name.

    Returns:
        FP32, shape ``[chunks]`` (``len(split_chunks(audio))``).

    Raises:
        tritonclient.utils.InferenceServerException: a request failed.
    """
    chunks = split_chunks(audio)
    probabilities = np.empty(len(chunks), np.float32)
    for i, chunk in enumerate(chunks):
        result = client.infer(
            model,
            [_chunk_input(chunk)],
            sequence_id=sequence_id,
            sequence_start=i == 0,
            sequence_end=i == len(chunks) - 1,
        )
        probabilities[i] = result.as_numpy(OUTPUT_NAME).reshape(-1)[0]
    return probabilities


def stream_probabilities(
    client: grpcclient.InferenceServerClient,
    audios: Mapping[int | str, np.ndarray],
    model: str = MODEL_NAME,
    *,
    window: int = 4,
    timeout_s: float = 60.0,
) -> dict[int | str, np.ndarray]:
    """Speech probabilities of several sequences over ONE gRPC stream, interleaved.

    Every sequence starts with ``window`` chunks in flight (round robin over the sequences);
    each answer sends that sequence's next chunk, so the sequences' requests interleave on
    the stream as live audio streams would.

    Args:
        client: a ``tritonclient.grpc`` client with no stream open.
        audios: correlation ID (non-zero, unique among live sequences) -> FP32 samples at
            16 kHz, shape ``[samples]``.
        model: the model name.
        window: chunks of one sequence in flight at most (>= 1).
        timeout_s: the longest wait for any one answer.

    Returns:
        correlation ID -> FP32 probabilities, shape ``[chunks]``.

    Raises:
        tritonclient.utils.InferenceServerException: a request failed.
        TimeoutError: no answer came for ``timeout_s``.
    """
    from tritonclient.utils import InferenceServerException

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    chunks = {cid: split_chunks(audio) for cid, audio in audios.items()}
    names = {f"s{n}": cid for n, cid in enumerate(chunks)}
    sent = dict.fromkeys(chunks, 0)
    results = {cid: np.full(len(c), np.nan, np.float32) for cid, c in chunks.items()}

    def send(name: str) -> None:
        cid = names[name]
        i = sent[cid]
        sent[cid] += 1
        try:
            client.async_stream_infer(
                model,
                [_chunk_input(chunks[cid][i])],
                request_id=f"{name}:{i}",
                sequence_id=cid,
                sequence_start=i == 0,
                sequence_end=i == len(chunks[cid]) - 1,
            )
        except InferenceServerException as broken:
            # NOTE: once the server ends the stream with an error, tritonclient refuses
            # further sends with a generic message; the server's reason went to the callback.
            try:
                while True:
                    _, error = answers.get(timeout=1.0)
                    if error is not None:
                        raise error from None
            except queue.Empty:
                raise broken from None

    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for _ in range(max(1, window)):
            for name, cid in names.items():
                if sent[cid] < len(chunks[cid]):
                    send(name)
        for _ in range(sum(len(c) for c in chunks.values())):
            try:
                result, error = answers.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"no answer from {model} for {timeout_s} s") from None
            if error is not None:
                raise error
            name, index = result.get_response().id.split(":")
            cid = names[name]
            output = result.as_numpy(OUTPUT_NAME)
            results[cid][int(index)] = output.reshape(-1)[0]
            if sent[cid] < len(chunks[cid]):
                send(name)
    finally:
        client.stop_stream()
    return results


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _format_segment(segment: Segment) -> str:
    return f"{segment.start_s:6.2f} s - {segment.end_s:6.2f} s"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Print the speech segments of 16 kHz WAV files, found by the Silero VAD "
        "model on a Triton server (one sequence per file).",
    )
    parser.add_argument("wavs", nargs="*", type=Path, metavar="WAV", help="16 kHz PCM WAV files")
    parser.add_argument("--url", default="localhost:8001", help="gRPC address of the server")
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument(
        "--stream",
        action="store_true",
        help="send every file's chunks interleaved over one gRPC stream (ModelStreamInfer)",
    )
    parser.add_argument(
        "--window", type=int, default=4, help="chunks in flight per file (--stream)"
    )
    parser.add_argument(
        "--sequence-id",
        type=int,
        default=None,
        help="correlation ID of the first file (the next files count up); default: random",
    )
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--min-speech-ms", type=float, default=250)
    parser.add_argument("--min-silence-ms", type=float, default=100)
    parser.add_argument("--speech-pad-ms", type=float, default=30)
    parser.add_argument(
        "--probabilities", action="store_true", help="also print every chunk's probability"
    )
    parser.add_argument(
        "--synthesise",
        type=Path,
        metavar="OUT_WAV",
        help="write speech-like test audio to OUT_WAV, print where its speech is, and exit",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of --synthesise")
    args = parser.parse_args(argv)
    if not args.wavs and args.synthesise is None:
        parser.error("give WAV files, or --synthesise OUT_WAV")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = _parse_args(argv)
    if args.synthesise is not None:
        audio, utterances = synthesise_speech(args.seed)
        write_wav(args.synthesise, audio)
        print(f"{args.synthesise}: {len(audio) / SAMPLE_RATE_HZ:.2f} s at {SAMPLE_RATE_HZ} Hz")
        for segment in utterances:
            print(f"{args.synthesise}  utterance  {_format_segment(segment)}")
        return 0

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    audios = {path: read_wav(path) for path in args.wavs}
    first = args.sequence_id if args.sequence_id is not None else random.randrange(1, 1 << 62)
    ids = {path: first + n for n, path in enumerate(audios)}
    try:
        if args.stream:
            client = grpcclient.InferenceServerClient(args.url)
            by_id = stream_probabilities(
                client, {ids[p]: a for p, a in audios.items()}, args.model, window=args.window
            )
            probabilities = {path: by_id[ids[path]] for path in audios}
            client.close()
        else:

            def run(path: Path) -> np.ndarray:
                with grpcclient.InferenceServerClient(args.url) as client:
                    return infer_probabilities(client, audios[path], ids[path], args.model)

            with ThreadPoolExecutor(max_workers=len(audios)) as pool:
                probabilities = dict(zip(audios, pool.map(run, audios), strict=True))
    except InferenceServerException as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    for path, audio in audios.items():
        if args.probabilities:
            for i, p in enumerate(probabilities[path]):
                print(f"{path}  {i * CHUNK_SAMPLES / SAMPLE_RATE_HZ:7.3f} s  {p:.3f}")
        segments = speech_segments(
            probabilities[path],
            len(audio),
            threshold=args.threshold,
            min_speech_ms=args.min_speech_ms,
            min_silence_ms=args.min_silence_ms,
            speech_pad_ms=args.speech_pad_ms,
        )
        for segment in segments:
            print(f"{path}  speech  {_format_segment(segment)}")
        if not segments:
            print(f"{path}  no speech")
    return 0


if __name__ == "__main__":
    sys.exit(main())
