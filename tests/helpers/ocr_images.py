"""Images of printed text for OCR tests, and the fonts to render them with.

A plain helper module (not a test), shared by the onnxruntime pipeline test and the end-to-end
server test. Fonts come from Python packages, never from the operating system, so a test
renders the same pixels on every machine: Pillow's built-in scalable font (Aileron Regular,
always there) and the DejaVu / Computer Modern .ttf files that matplotlib ships in
``matplotlib/mpl-data/fonts/ttf`` (located without importing matplotlib).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont


@dataclass(frozen=True)
class Font:
    """A font to render with: ``path`` None means Pillow's built-in scalable default font."""

    name: str
    path: Path | None


PILLOW_DEFAULT = Font("pillow-default", None)

MATPLOTLIB_FONT_FILES = {
    "DejaVuSans": "DejaVuSans.ttf",
    "DejaVuSerif": "DejaVuSerif.ttf",
    "DejaVuSansMono": "DejaVuSansMono.ttf",
    "DejaVuSans-Bold": "DejaVuSans-Bold.ttf",
}
"""Regular faces of three families and one bold face, all with full Latin coverage."""

FONT_NAMES: tuple[str, ...] = (PILLOW_DEFAULT.name, *MATPLOTLIB_FONT_FILES)
"""Every font a test may ask for by name (``find_font``)."""


def matplotlib_fonts_dir() -> Path | None:
    """``matplotlib/mpl-data/fonts/ttf`` of the installed matplotlib, or None if absent."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / "fonts" / "ttf"
    return directory if directory.is_dir() else None


def find_font(name: str) -> Font | None:
    """The font called ``name`` (one of ``FONT_NAMES``), or None if its package is missing."""
    if name == PILLOW_DEFAULT.name:
        return PILLOW_DEFAULT
    directory = matplotlib_fonts_dir()
    if directory is None or not (directory / MATPLOTLIB_FONT_FILES[name]).is_file():
        return None
    return Font(name, directory / MATPLOTLIB_FONT_FILES[name])


def available_fonts() -> list[Font]:
    """Every font of ``FONT_NAMES`` that is installed (Pillow's default always is)."""
    return [font for name in FONT_NAMES if (font := find_font(name)) is not None]


def load_font(font_path: Path | None, size: int) -> ImageFont.FreeTypeFont:
    """A FreeType font of ``size`` pixels; Pillow's built-in one when ``font_path`` is None."""
    if font_path is None:
        font = ImageFont.load_default(size=size)
        if not isinstance(font, ImageFont.FreeTypeFont):
            raise RuntimeError("this Pillow has no FreeType support: cannot scale its font")
        return font
    return ImageFont.truetype(str(font_path), size=size)


def render_text_image(
    lines: Sequence[str],
    font_path: Path | None,
    size: int,
    *,
    margin: int | None = None,
    line_spacing: float = 1.8,
) -> Image.Image:
    """Render ``lines`` black on white, left-aligned, one below the other, as an RGB image.

    Args:
        lines: the text lines, top to bottom.
        font_path: a .ttf file, or None for Pillow's built-in scalable font.
        size: font size in pixels.
        margin: white border around the text (default: one font size), so the detector's
            boxes, which grow beyond the glyphs, stay inside the image.
        line_spacing: distance between baselines as a multiple of ``size``; generous, so
            every line is a separate text box.
    """
    font = load_font(font_path, size)
    pad = size if margin is None else margin
    step = round(size * line_spacing)
    # NOTE: getbbox is relative to the drawing origin: [2] is the right edge, [3] the bottom
    # of the lowest descender.
    width = math.ceil(max(font.getbbox(line)[2] for line in lines)) + 2 * pad
    height = step * (len(lines) - 1) + math.ceil(max(font.getbbox(ln)[3] for ln in lines)) + 2 * pad
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((pad, pad + i * step), line, font=font, fill="black")
    return image


def to_bgr(image: Image.Image) -> np.ndarray:
    """A PIL image as the BGR uint8 array OpenCV (and so PP-OCR) works on."""
    rgb = np.asarray(image.convert("RGB"))
    return np.ascontiguousarray(rgb[:, :, ::-1])
