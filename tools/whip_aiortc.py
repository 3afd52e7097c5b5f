#!/usr/bin/python3
"""A third-party WHIP client for mdag's interop test: aiortc (Debian's
python3-aiortc) streams a test pattern, or a real clip (--clip FILE, played
in real time and looped by aiortc's MediaPlayer, scaled to at most
--max-width pixels wide), in VP8 or H.264 (--codec; the offer carries only
that codec: setCodecPreferences) to a WHIP endpoint, opens a
DataChannel and counts the per-frame results the server sends on it, and
reads the stream's results as Server-Sent Events too, as clients without a
DataChannel do (OBS, GStreamer), and records the server's goodbye on the
DataChannel (why the stream ended). aiortc offers the DataChannel in its
own media section with its own ICE credentials, bundled with the video.
--no-datachannel offers video only. Prints one JSON summary line; exit 0
when results came.

Run with Debian's interpreter:
    /usr/bin/python3 tools/whip_aiortc.py URL [SECONDS] [--no-datachannel]
        [--codec vp8|h264] [--clip FILE] [--max-width N] [--repost]

--repost: when the server ends the stream (the results' end event: its
ingest worker was lost), post the offer again on a new connection until
SECONDS are up, as a WHIP client reconnects; the summary counts the posts.
"""
import argparse
import asyncio
import json
import sys
import threading
import time
import urllib.parse
import urllib.request

import numpy
from av import VideoFrame
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCRtpSender, RTCSessionDescription, VideoStreamTrack
from aiortc.contrib.media import MediaPlayer


class Pattern(VideoStreamTrack):
    """A moving white square on grey, 320x240, 15 fps."""

    def __init__(self):
        super().__init__()
        self.n = 0

    async def recv(self):
        pts, time_base = await self.next_timestamp()
        img = numpy.full((240, 320, 3), 90, numpy.uint8)
        x = (self.n * 4) % 280
        img[100:140, x:x + 40] = 255
        self.n += 1
        frame = VideoFrame.from_ndarray(img, format="bgr24")
        frame.pts, frame.time_base = pts, time_base
        return frame


class Scaled(MediaStreamTrack):
    """A video track's frames scaled down to at most max_width pixels wide
    (aspect kept, even sizes), timestamps unchanged."""

    kind = "video"

    def __init__(self, track, max_width):
        super().__init__()
        self.track = track
        self.max_width = max_width

    async def recv(self):
        frame = await self.track.recv()
        if frame.width <= self.max_width:
            return frame
        w = self.max_width & ~1
        h = (frame.height * w // frame.width) & ~1
        out = frame.reformat(width=w, height=h)
        out.pts, out.time_base = frame.pts, frame.time_base
        return out


def read_sse(url, out, stop):
    """Count result events until the stream ends or stop is set."""
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            event = ""
            for raw in resp:
                if stop.is_set():
                    return
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    if event == "end":
                        out["ended"] = json.loads(line[6:])
                        return
                    r = json.loads(line[6:])
                    out["results"] += 1
                    out["outcomes"][r["outcome"]] = out["outcomes"].get(r["outcome"], 0) + 1
                    if r["outcome"] != "finished":  # why: the module and its reason
                        why = f'{r["outcome"]} at {r.get("module", "")}: {r.get("reason", "")}'
                        out["why"][why] = out["why"].get(why, 0) + 1
    except Exception as e:  # reported in the summary
        out["sse_error"] = str(e)


async def post(url, summary, datachannel, codec, clip, max_width):
    """One WHIP session: a peer connection offering the track, POSTed to
    url; returns (pc, player, location, results URL)."""
    pc = RTCPeerConnection()
    player = None
    if clip:
        player = MediaPlayer(clip, loop=True)
        if player.video is None:
            raise SystemExit(f"{clip}: no video stream")
        track = Scaled(player.video, max_width)
    else:
        track = Pattern()
    tr = pc.addTransceiver(track, direction="sendonly")
    # Only the codec asked for: the offer carries nothing else (H.264:
    # both of aiortc's profile-level-ids, 42001f and 42e01f).
    mime = "video/" + codec
    prefs = [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType.lower() == mime]
    if not prefs:
        raise SystemExit(f"aiortc has no {codec} encoder")
    tr.setCodecPreferences(prefs)
    if datachannel:
        dc = pc.createDataChannel("results")

        @dc.on("open")
        def on_open():
            summary["dc_opened"] = True

        @dc.on("message")
        def on_message(msg):
            try:
                r = json.loads(msg)
                if "ended" in r:  # the server's goodbye: why the stream ended
                    summary["dc_ended"] = r["ended"]
                    return
                summary["dc_results"] += 1
                summary["dc_outcomes"][r["outcome"]] = summary["dc_outcomes"].get(r["outcome"], 0) + 1
            except Exception:
                summary["dc_errors"] += 1
    await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers before returning
    summary["offered"] = sorted({line.split(" ", 1)[1].split("/")[0] for line in pc.localDescription.sdp.splitlines()
                                 if line.startswith("a=rtpmap:")})
    req = urllib.request.Request(url, data=pc.localDescription.sdp.encode(), method="POST",
                                 headers={"Content-Type": "application/sdp"})
    with urllib.request.urlopen(req, timeout=15) as resp:
        if resp.status != 201:
            raise SystemExit(f"WHIP POST answered {resp.status}")
        location = urllib.parse.urljoin(url, resp.headers["Location"])
        results = urllib.parse.urljoin(url, resp.headers["Mdag-Results"])
        answer = resp.read().decode()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    summary["answered"] = sorted({line.split(" ", 1)[1].split("/")[0] for line in answer.splitlines()
                                  if line.startswith("a=rtpmap:")})
    summary["location"] = location
    summary["posts"] += 1
    summary["streams"].append(location.rsplit("/", 1)[1])
    return pc, player, location, results


async def close(pc, player):
    await pc.close()
    if player is not None and player.video is not None:
        player.video.stop()


async def main(url, seconds, datachannel, codec, clip, max_width, repost):
    summary = {"results": 0, "outcomes": {}, "why": {}, "dc_results": 0, "dc_outcomes": {}, "dc_opened": False, "dc_errors": 0,
               "codec": codec, "clip": clip or "pattern", "posts": 0, "streams": [], "ends": []}
    deadline = time.monotonic() + seconds
    while True:
        pc, player, location, results = await post(url, summary, datachannel, codec, clip, max_width)
        stop = threading.Event()
        summary.pop("ended", None)
        t = threading.Thread(target=read_sse, args=(results, summary, stop), daemon=True)
        t.start()
        # until the time is up, or (--repost) the server ends the stream
        # (its worker was lost): then post the offer again, as WHIP clients
        # reconnect
        while time.monotonic() < deadline and not (repost and ("ended" in summary or "sse_error" in summary)):
            await asyncio.sleep(0.1)
        if time.monotonic() < deadline:
            summary["ends"].append(summary.get("ended", summary.pop("sse_error", "")))
            await close(pc, player)
            continue
        break
    urllib.request.urlopen(urllib.request.Request(location, method="DELETE"), timeout=10).close()
    t.join(5)
    stop.set()
    await close(pc, player)
    print(json.dumps(summary), flush=True)
    ok = summary["results"] > 0 and (not datachannel or summary["dc_results"] > 0)
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="aiortc WHIP client for mdag's interop tests")
    ap.add_argument("url")
    ap.add_argument("seconds", nargs="?", type=float, default=20)
    ap.add_argument("--no-datachannel", action="store_true")
    ap.add_argument("--codec", choices=["vp8", "h264"], default="vp8")
    ap.add_argument("--clip", help="a video file to stream (looped) instead of the pattern")
    ap.add_argument("--max-width", type=int, default=384, help="scale the clip down to at most this wide")
    ap.add_argument("--repost", action="store_true", help="post the offer again when the server ends the stream (its worker was lost)")
    a = ap.parse_args()
    sys.exit(asyncio.run(main(a.url, a.seconds, not a.no_datachannel, a.codec, a.clip, a.max_width, a.repost)))
