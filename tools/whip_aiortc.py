#!/usr/bin/python3
"""A third-party WHIP client for mdag's interop test: aiortc (Debian's
python3-aiortc) streams a VP8 test pattern to a WHIP endpoint, opens a
DataChannel and counts the per-frame results the server sends on it, and
reads the stream's results as Server-Sent Events too, as clients without a
DataChannel do (OBS, GStreamer), and records the server's goodbye on the
DataChannel (why the stream ended). aiortc offers the DataChannel in its
own media section with its own ICE credentials, bundled with the video.
--no-datachannel offers video only. Prints one JSON summary line; exit 0
when results came.

Run with Debian's interpreter:
    /usr/bin/python3 tools/whip_aiortc.py URL [SECONDS] [--no-datachannel]
"""
import asyncio
import fractions
import json
import sys
import threading
import time
import urllib.parse
import urllib.request

import numpy
from av import VideoFrame
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription, VideoStreamTrack


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
    except Exception as e:  # reported in the summary
        out["sse_error"] = str(e)


async def main(url, seconds, datachannel):
    pc = RTCPeerConnection()
    tr = pc.addTransceiver(Pattern(), direction="sendonly")
    vp8 = [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType.lower() == "video/vp8"]
    tr.setCodecPreferences(vp8)
    summary = {"results": 0, "outcomes": {}, "dc_results": 0, "dc_outcomes": {}, "dc_opened": False, "dc_errors": 0}
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
    req = urllib.request.Request(url, data=pc.localDescription.sdp.encode(), method="POST",
                                 headers={"Content-Type": "application/sdp"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        if resp.status != 201:
            raise SystemExit(f"WHIP POST answered {resp.status}")
        location = urllib.parse.urljoin(url, resp.headers["Location"])
        results = urllib.parse.urljoin(url, resp.headers["Mdag-Results"])
        answer = resp.read().decode()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    summary["location"] = location
    stop = threading.Event()
    t = threading.Thread(target=read_sse, args=(results, summary, stop), daemon=True)
    t.start()
    await asyncio.sleep(seconds)
    urllib.request.urlopen(urllib.request.Request(location, method="DELETE"), timeout=10).close()
    t.join(5)
    stop.set()
    await pc.close()
    print(json.dumps(summary), flush=True)
    ok = summary["results"] > 0 and (not datachannel or summary["dc_results"] > 0)
    return 0 if ok else 1


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no-datachannel"]
    sys.exit(asyncio.run(main(args[0], float(args[1]) if len(args) > 1 else 20, "--no-datachannel" not in sys.argv)))
