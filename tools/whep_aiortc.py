#!/usr/bin/python3
"""A third-party WHEP client for mdag's egress interop test and benchmark:
aiortc (Debian's python3-aiortc) POSTs a recvonly video offer to a WHEP
endpoint, plays the answer's stream for SECONDS, decodes every frame and
counts the frames that show a drawn box: a horizontal run of at least
--min-run pixels within --tol of --colour (B,G,R). DELETEs its resource at
the end. Prints one JSON summary line; exit 0 when frames came.

    /usr/bin/python3 tools/whep_aiortc.py URL [SECONDS] [--colour B,G,R]
        [--min-run N] [--tol N] [--token T]
"""
import argparse
import asyncio
import json
import sys
import time
import urllib.parse
import urllib.request

import numpy
from aiortc import RTCPeerConnection, RTCSessionDescription


def longest_run(mask):
    """The longest horizontal run of True in a 2-D mask."""
    best = 0
    rows = numpy.nonzero(mask.sum(axis=1) > best)[0]
    for y in rows:
        r = numpy.concatenate(([0], mask[y].astype(numpy.int8), [0]))
        d = numpy.diff(r)
        starts, ends = numpy.nonzero(d == 1)[0], numpy.nonzero(d == -1)[0]
        if len(starts):
            best = max(best, int((ends - starts).max()))
    return best


def request(method, url, body=None, token=None, ctype=None):
    req = urllib.request.Request(url, data=body, method=method)
    if ctype:
        req.add_header("Content-Type", ctype)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("seconds", nargs="?", type=float, default=5)
    ap.add_argument("--colour", default="")
    ap.add_argument("--min-run", type=int, default=20)
    ap.add_argument("--tol", type=int, default=60)
    ap.add_argument("--token", default="")
    ap.add_argument("--no-decode-check", action="store_true", help="decode frames but do not look at their pixels (benchmark)")
    a = ap.parse_args()
    colour = numpy.array([int(c) for c in a.colour.split(",")], numpy.int16) if a.colour else None

    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    sum_ = {"frames": 0, "with_box": 0, "longest_run": 0, "width": 0, "height": 0}
    got_track = asyncio.Event()
    tasks = []

    @pc.on("track")
    def on_track(track):
        async def read():
            while True:
                try:
                    frame = await track.recv()
                except Exception:
                    return
                sum_["frames"] += 1
                sum_["width"], sum_["height"] = frame.width, frame.height
                if colour is None or a.no_decode_check:
                    continue
                img = frame.to_ndarray(format="bgr24").astype(numpy.int16)
                mask = (numpy.abs(img - colour) <= a.tol).all(axis=2)
                run = longest_run(mask)
                sum_["longest_run"] = max(sum_["longest_run"], run)
                if run >= a.min_run:
                    sum_["with_box"] += 1
        tasks.append(asyncio.ensure_future(read()))
        got_track.set()

    await pc.setLocalDescription(await pc.createOffer())
    loop = asyncio.get_running_loop()
    code, headers, body = await loop.run_in_executor(None, request, "POST", a.url, pc.localDescription.sdp.encode(), a.token, "application/sdp")
    sum_["status"] = code
    if code != 201:
        sum_["error"] = body.strip()
        print(json.dumps(sum_))
        await pc.close()
        return 1
    location = urllib.parse.urljoin(a.url, headers.get("Location", ""))
    sum_["location"] = headers.get("Location", "")
    await pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
    start = time.monotonic()
    await asyncio.sleep(a.seconds)
    sum_["seconds"] = round(time.monotonic() - start, 2)
    code, _, _ = await loop.run_in_executor(None, request, "DELETE", location, None, a.token)
    sum_["delete_status"] = code
    await pc.close()
    for t in tasks:
        t.cancel()
    print(json.dumps(sum_))
    return 0 if sum_["frames"] > 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
