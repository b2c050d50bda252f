"""``examples/vad_client.py`` without a server: WAV files, chunks, hysteresis, test audio.

The last tests run Silero on the synthesised audio directly with onnxruntime (skipped when
the ``silero-vad`` package is absent): what it calls speech there is what the client prints.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.vad import onnx_session, reference_probabilities, vad_client
from triton_mp.cli import assets

SR = vad_client.SAMPLE_RATE_HZ
CHUNK = vad_client.CHUNK_SAMPLES
Segment = vad_client.Segment


def _write_pcm(path: Path, frames: bytes, *, width: int, channels: int, rate: int = SR) -> None:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(width)
        f.setframerate(rate)
        f.writeframes(frames)


def test_wav_round_trip(tmp_path: Path) -> None:
    audio = np.sin(np.linspace(0, 100, 5000)).astype(np.float32) * 0.9
    vad_client.write_wav(tmp_path / "a.wav", audio)
    back = vad_client.read_wav(tmp_path / "a.wav")
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, audio, atol=2 / 32768)


@pytest.mark.parametrize(
    ("width", "raw", "expected"),
    [
        (1, bytes([128, 255, 0]), [0.0, 127 / 128, -1.0]),
        (2, np.array([0, 16384, -32768], "<i2").tobytes(), [0.0, 0.5, -1.0]),
        (3, bytes([0, 0, 0, 0, 0, 0x40, 0, 0, 0x80]), [0.0, 0.5, -1.0]),
        (4, np.array([0, 1 << 30, -(1 << 31)], "<i4").tobytes(), [0.0, 0.5, -1.0]),
    ],
)
def test_reads_every_pcm_width(
    tmp_path: Path, width: int, raw: bytes, expected: list[float]
) -> None:
    _write_pcm(tmp_path / "a.wav", raw, width=width, channels=1)
    np.testing.assert_allclose(vad_client.read_wav(tmp_path / "a.wav"), expected)


def test_channels_are_averaged(tmp_path: Path) -> None:
    frames = np.array([16384, 0, -32768, 32767], "<i2").tobytes()  # two stereo frames
    _write_pcm(tmp_path / "a.wav", frames, width=2, channels=2)
    np.testing.assert_allclose(vad_client.read_wav(tmp_path / "a.wav"), [0.25, -0.5 / 32768])


def test_other_sample_rates_are_refused(tmp_path: Path) -> None:
    _write_pcm(tmp_path / "a.wav", bytes(4), width=2, channels=1, rate=8000)
    with pytest.raises(ValueError, match="8000 Hz; the model wants 16000 Hz"):
        vad_client.read_wav(tmp_path / "a.wav")


def test_split_chunks_pads_the_last() -> None:
    audio = np.arange(1, 2 * CHUNK + 11, dtype=np.float32)
    chunks = vad_client.split_chunks(audio)
    assert (chunks.dtype, chunks.shape) == (np.float32, (3, CHUNK))
    np.testing.assert_array_equal(chunks.reshape(-1)[: len(audio)], audio)
    assert not chunks[2, 10:].any()
    assert vad_client.split_chunks(np.zeros(0, np.float32)).shape == (1, CHUNK)


def _segments(probabilities: list[float], **kwargs: float) -> list[tuple[int, int]]:
    """Segments in samples, for exact comparisons."""
    total = int(kwargs.pop("total", len(probabilities) * CHUNK))
    found = vad_client.speech_segments(probabilities, total, **kwargs)
    return [(round(s.start_s * SR), round(s.end_s * SR)) for s in found]


PAD = int(SR * 30 / 1000)  # 480 samples


def test_no_speech() -> None:
    assert _segments([0.2] * 50) == []


def test_one_segment_is_padded() -> None:
    probabilities = [0.0] * 10 + [0.9] * 20 + [0.0] * 10
    assert _segments(probabilities) == [(10 * CHUNK - PAD, 30 * CHUNK + PAD)]


def test_segments_of_min_speech_or_less_are_dropped() -> None:
    # 8 chunks = 256 ms > 250 ms stays; 7 chunks = 224 ms goes
    assert _segments([0.0] * 5 + [0.9] * 8 + [0.0] * 10) == [(5 * CHUNK - PAD, 13 * CHUNK + PAD)]
    assert _segments([0.0] * 5 + [0.9] * 7 + [0.0] * 10) == []


def test_short_dips_do_not_split_and_long_ones_do() -> None:
    # the end is where the probability first fell below 0.35; it takes effect once it stayed
    # below 0.5 for 100 ms: 4 low chunks (96 ms after the first) do not split, 5 do
    four = [0.9] * 10 + [0.1] * 4 + [0.9] * 10 + [0.0] * 10
    assert _segments(four) == [(0, 24 * CHUNK + PAD)]
    five = [0.9] * 10 + [0.1] * 5 + [0.9] * 10 + [0.0] * 10
    assert _segments(five) == [(0, 10 * CHUNK + PAD), (15 * CHUNK - PAD, 25 * CHUNK + PAD)]


def test_between_the_thresholds_speech_goes_on() -> None:
    probabilities = [0.9] * 10 + [0.4] * 20 + [0.0] * 10
    assert _segments(probabilities) == [(0, 30 * CHUNK + PAD)]
    assert _segments(probabilities, neg_threshold=0.45) == [(0, 10 * CHUNK + PAD)]


def test_a_pending_end_waits_for_a_low_chunk_and_speech_cancels_it() -> None:
    # the first chunk below 0.35 marks a possible end; chunks between the thresholds neither
    # confirm nor cancel it; a low chunk 100 ms or more after the mark confirms it
    confirmed = [0.9] * 10 + [0.1, 0.4, 0.4, 0.4, 0.1] + [0.9] * 10 + [0.0] * 10
    assert _segments(confirmed)[0] == (0, 10 * CHUNK + PAD)
    unconfirmed = [0.9] * 10 + [0.1, 0.4, 0.4, 0.4, 0.4] + [0.9] * 10 + [0.0] * 10
    assert _segments(unconfirmed) == [(0, 25 * CHUNK + PAD)]
    cancelled = [0.9] * 10 + [0.1, 0.4, 0.9, 0.4, 0.1] + [0.9] * 10 + [0.0] * 10
    assert _segments(cancelled) == [(0, 25 * CHUNK + PAD)]


def test_close_neighbours_share_the_gap_and_the_end_is_clamped() -> None:
    # a gap of 10 chunks is wider than 2 pads: each side gets a pad
    probabilities = [0.9] * 10 + [0.0] * 10 + [0.9] * 10
    total = 30 * CHUNK - 100
    assert _segments(probabilities, total=total) == [
        (0, 10 * CHUNK + PAD),
        (20 * CHUNK - PAD, total),
    ]
    # with 100 ms pads the gap (320 ms) is narrower than two: halves meet in the middle
    assert _segments(probabilities, total=total, speech_pad_ms=200) == [
        (0, 15 * CHUNK),
        (15 * CHUNK, total),
    ]


def test_speech_still_open_at_the_end_ends_there() -> None:
    probabilities = [0.0] * 5 + [0.9] * 20
    assert _segments(probabilities, total=25 * CHUNK - 7) == [(5 * CHUNK - PAD, 25 * CHUNK - 7)]


def test_synthesise_writes_a_wav_and_prints_the_utterances(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo.wav"
    assert vad_client.main(["--synthesise", str(out), "--seed", "3"]) == 0
    audio, utterances = vad_client.synthesise_speech(3)
    np.testing.assert_allclose(vad_client.read_wav(out), audio, atol=2 / 32768)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(utterances) == 4
    assert all("utterance" in line for line in lines[1:])


def test_synthesis_is_deterministic() -> None:
    a, ua = vad_client.synthesise_speech(11)
    b, ub = vad_client.synthesise_speech(11)
    np.testing.assert_array_equal(a, b)
    assert ua == ub
    assert np.abs(a).max() <= 0.45


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_silero_hears_the_utterances_and_not_the_tone_or_noise(seed: int) -> None:
    try:
        onnx_file = assets.silero_vad_file()
    except assets.VadModelMissing as e:
        pytest.skip(e.message)
    audio, utterances = vad_client.synthesise_speech(seed)
    probabilities = reference_probabilities(onnx_session(onnx_file), audio)
    found = vad_client.speech_segments(probabilities, len(audio))
    assert len(found) == len(utterances), (found, utterances)
    for segment, utterance in zip(found, utterances, strict=True):
        # within a few chunks of the truth (a quiet first syllable may be missed)
        assert abs(segment.start_s - utterance.start_s) < 0.3, (segment, utterance)
        assert abs(segment.end_s - utterance.end_s) < 0.3, (segment, utterance)
