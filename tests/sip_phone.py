"""Real SIP phones and trunks for the tests: Debian's baresip (`baresip-core`) as a phone whose
microphone is a WAV file (its `aufile` module) and whose ear is recorded (`sndfile`), and SIPp
(`sip-tester`) as a trunk placing calls by its built-in scenarios. Both are real SIP stacks, not
this project's code."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PCAP_DIR = Path("/usr/share/sip-tester")  # SIPp's G.711 A-law and RFC 4733 key recordings


def need(tool: str) -> str:
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if path is None:
        raise RuntimeError(f"{tool} is missing: run scripts/setup.sh --test (Debian's baresip-core, sip-tester, "
                           f"kamailio)")
    return path


def free_udp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _taken(host: str, port: int) -> bool:
    """Whether a UDP port is bound by another program."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def write_wav(path: Path, samples: np.ndarray, rate: int = 8000) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def read_wav(path: Path) -> np.ndarray:
    """A 16-bit mono WAV as float32."""
    with wave.open(str(path), "rb") as wav:
        data = wav.readframes(wav.getnframes())
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768


@dataclass
class Heard:
    """What a baresip phone heard and said on its calls."""

    log: str
    recordings: list[Path]  # one WAV per call, what the phone received (decoded), 8 kHz

    def audio(self, index: int = 0) -> np.ndarray:
        return read_wav(self.recordings[index])

    @property
    def established(self) -> bool:
        return "Call established" in self.log


class Baresip:
    """One baresip phone on `host:port`, speaking `microphone` (8 kHz mono WAV; the call ends when the
    file does) and recording what it hears. It answers calls at once (answermode=auto)."""

    def __init__(self, folder: Path, microphone: Path, host: str = "127.0.0.1", port: int | None = None,
                 user: str = "tester", auth: tuple[str, str] | None = None) -> None:
        need("baresip")
        self.folder = folder
        self.host, self.port, self.user = host, port or free_udp_port(host), user
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "rec").mkdir(exist_ok=True)
        (folder / "config").write_text("\n".join([
            "poll_method epoll",
            f"sip_listen {self.host}:{self.port}",
            "audio_player aubridge,nil",  # a player that plays nowhere: the ear is sndfile's recording
            f"audio_source aufile,{microphone}",
            "audio_alert aubridge,nil",
            "audio_srate 8000",
            "audio_channels 1",
            "module_path /usr/lib/baresip/modules",
            "module g711.so", "module aufile.so", "module aubridge.so", "module sndfile.so",
            "module_app account.so", "module_app menu.so", "module stdio.so",
            f"snd_path {folder / 'rec'}",
            "",
        ]))
        params = ";regint=0;answermode=auto;audio_codecs=PCMU,PCMA"
        if auth is not None:
            params += f";auth_user={auth[0]};auth_pass={auth[1]}"
        (folder / "accounts").write_text(f"<sip:{user}@{self.host}:{self.port}>{params}\n")

    @property
    def uri(self) -> str:
        return f"sip:{self.user}@{self.host}:{self.port}"

    async def answering(self, seconds: float) -> asyncio.Task[Heard]:
        """Run the phone for `seconds` in a task, once it listens for calls (its SIP port is taken)."""
        task = asyncio.create_task(self.run(seconds))
        deadline = asyncio.get_running_loop().time() + 30
        while not _taken(self.host, self.port):
            if task.done() or asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"baresip did not listen on {self.host}:{self.port}: "
                                   f"{(await task).log[-2000:] if task.done() else 'not within 30 s'}")
            await asyncio.sleep(0.05)
        return task

    async def run(self, seconds: float, dial: str | None = None) -> Heard:
        """Run the phone for `seconds` (dialling `dial` first, if given) and return what it heard."""
        before = set((self.folder / "rec").glob("*-dec.wav"))
        command = [need("baresip"), "-f", str(self.folder), "-t", str(int(seconds))]
        if dial is not None:
            command += ["-e", f"/dial {dial}"]
        proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), seconds + 15)
        except TimeoutError:
            proc.kill()
            out, _ = await proc.communicate()
        log = out.decode(errors="replace")
        (self.folder / "baresip.log").open("a").write(log)
        recordings = sorted(set((self.folder / "rec").glob("*-dec.wav")) - before)
        return Heard(log, recordings)


async def sipp(target: str, scenario: str, *, calls: int = 1, limit: int = 1, rate: int = 10, hold_ms: int = 3000,
               folder: Path, service: str = "agent", timeout: float = 120, tcp: bool = False,
               send_to: str | None = None) -> tuple[int, str]:
    """Run SIPp's built-in `scenario` (uac, uac_pcap) against `target` (host:port): `calls` calls,
    `limit` at once, `rate` new ones a second, over UDP (or one TCP connection: `tcp`), sent to
    `send_to` (host:port) where the request URI names another. Returns (exit status, its output): 0
    when every call succeeded."""
    folder.mkdir(parents=True, exist_ok=True)
    pcap = folder / "pcap"
    pcap.mkdir(exist_ok=True)
    for recording in PCAP_DIR.glob("*.pcap"):  # uac_pcap reads pcap/... relative to where it runs
        if not (pcap / recording.name).exists():
            shutil.copy(recording, pcap / recording.name)
    command = [need("sipp"), "-sn", scenario, target, "-m", str(calls), "-l", str(limit), "-r", str(rate),
               "-d", str(hold_ms), "-s", service, "-i", "127.0.0.1", "-p", str(free_udp_port()), "-nostdin",
               "-trace_err", "-timeout", str(int(timeout)), "-timeout_error", *(["-t", "t1"] if tcp else []),
               *(["-rsa", send_to] if send_to else [])]
    proc = await asyncio.create_subprocess_exec(*command, cwd=folder, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout + 15)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
    errors = "\n".join(p.read_text(errors="replace")[-2000:] for p in folder.glob("*errors.log"))
    return proc.returncode or 0, out.decode(errors="replace")[-3000:] + errors


@contextlib.asynccontextmanager
async def kamailio_edge(folder: Path, service_port: int) -> AsyncIterator[int]:
    """Debian's Kamailio with the project's edge configuration (deploy/kamailio/edge.cfg), relaying
    calls that reach it over UDP or TCP to the service on `service_port` (UDP). Yields its port."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_udp_port()
    config = Path(__file__).resolve().parents[1] / "deploy" / "kamailio" / "edge.cfg"
    log = (folder / "kamailio.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        need("kamailio"), "-DD", "-E", "-f", str(config), "-Y", str(folder), "-P", str(folder / "kamailio.pid"),
        "-A", "EDGE_ADDRESS=127.0.0.1", "-A", f"EDGE_PORT={port}", "-A", f'SERVICE_URI="sip:127.0.0.1:{service_port}"',
        "-A", 'TRUNKS="192.0.2.0/24,127.0.0.1/32"',
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while True:  # up once it takes TCP connections
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
                    said = (folder / "kamailio.log").read_text()[-2000:]
                    raise RuntimeError(f"kamailio did not start: {said}") from None
                await asyncio.sleep(0.1)
        yield port
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()
