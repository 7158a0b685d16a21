"""Offscreen rendering and video files for ``asyncrl eval --video``.

MuJoCo renders through OpenGL; on a machine with no display it needs an offscreen backend: EGL
(a GPU driver, or Mesa's) or OSMesa (Mesa's CPU renderer, Debian package ``libosmesa6``). Which
one works can only be told by trying, and a process cannot switch backends once PyOpenGL is
loaded, so :func:`choose_gl_backend` tries each in a short child process and sets ``MUJOCO_GL``
(and ``PYOPENGL_PLATFORM``) for this one before any MuJoCo rendering starts.

Videos are written with imageio's ffmpeg plugin (``imageio[ffmpeg]``, which ships its own ffmpeg
binary): H.264 in an MP4 container, playable by common players and browsers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

INSTALL_GL = (
    "no offscreen OpenGL for MuJoCo rendering: install OSMesa (Debian/Ubuntu: apt-get install "
    "libosmesa6) or an EGL driver (libegl1 with Mesa or a GPU driver), or set MUJOCO_GL to a working "
    "backend"
)

# Renders one frame of a one-sphere model with the backend named in MUJOCO_GL.
_PROBE = """
import mujoco
m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><light pos="0 0 3"/><geom size="0.5"/></worldbody></mujoco>')
d = mujoco.MjData(m)
mujoco.mj_forward(m, d)
r = mujoco.Renderer(m, 32, 32)
r.update_scene(d)
assert r.render().shape == (32, 32, 3)
r.close()
"""


class RenderError(RuntimeError):
    """No way to render here (no offscreen OpenGL, no video writer); the message says what to install."""


def gl_backend_works(backend: str, timeout_s: float = 60.0) -> bool:
    """True if MuJoCo renders a frame with ``backend`` ("egl", "osmesa", "glfw") in a child process."""
    env = dict(os.environ, MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
    if backend == "glfw":
        env.pop("PYOPENGL_PLATFORM")
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def gl_candidates() -> list[str]:
    """Backends to try, in order: MUJOCO_GL alone when the user set it; else the comma-separated
    list in ASYNCRL_GL_BACKENDS when set; else glfw (only with a display), egl, osmesa."""
    if os.environ.get("MUJOCO_GL"):
        return [os.environ["MUJOCO_GL"].lower()]
    if os.environ.get("ASYNCRL_GL_BACKENDS"):
        return [b.strip().lower() for b in os.environ["ASYNCRL_GL_BACKENDS"].split(",") if b.strip()]
    return (["glfw"] if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") else []) + ["egl", "osmesa"]


def choose_gl_backend(probe=gl_backend_works) -> str | None:
    """Pick the first working backend of :func:`gl_candidates`, export it as ``MUJOCO_GL`` (and
    ``PYOPENGL_PLATFORM``) for this process, and return it; None when none works. Call it before
    MuJoCo renders anything in this process."""
    for backend in gl_candidates():
        if probe(backend):
            os.environ["MUJOCO_GL"] = backend
            if backend != "glfw":
                os.environ["PYOPENGL_PLATFORM"] = backend
            return backend
    return None


class VideoWriter:
    """Frames [H, W, 3] uint8 -> an H.264 MP4 at ``fps`` frames per second.

    Raises RenderError (with the pip command) when imageio or its ffmpeg plugin is missing, and
    OSError when ``path`` cannot be written."""

    def __init__(self, path: str | Path, fps: float):
        try:
            import imageio.v2 as imageio
            import imageio_ffmpeg  # noqa: F401  (the plugin; imageio alone cannot write MP4)
        except ImportError:
            raise RenderError(
                "writing MP4 needs imageio with ffmpeg: .venv/bin/pip install 'asyncrl[video]' "
                "(or pip install 'imageio[ffmpeg]')"
            ) from None
        self.path = Path(path)
        with open(self.path, "wb"):  # fail now, with the path, rather than after the episode
            pass
        # macro_block_size 1: keep the frame size as rendered (no silent resize warnings)
        self._w = imageio.get_writer(
            str(self.path),
            fps=fps,
            codec="libx264",
            quality=7,
            macro_block_size=1,
            pixelformat="yuv420p",
            ffmpeg_log_level="error",
        )
        self.frames = 0

    def add(self, frame: np.ndarray) -> None:
        """One frame [H, W, 3] uint8 (H and W even: H.264 with yuv420p needs them so)."""
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"a video frame must be [H, W, 3] uint8, got {frame.shape} {frame.dtype}")
        h, w = frame.shape[:2]
        self._w.append_data(frame[: h - h % 2, : w - w % 2])
        self.frames += 1

    def close(self) -> None:
        self._w.close()
