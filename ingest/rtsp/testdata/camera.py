#!/usr/bin/python3
"""An RTSP IP camera for ingest/rtsp's tests: GStreamer's RTSP server
(GstRtspServer through python3-gi) serving a moving test pattern encoded
live with x264enc or x265enc.

    camera.py --port 0 --path /x --codec h264|h265|mjpeg [--audio] [--user U --password P --auth basic|digest]

Prints "ready PORT" on stdout once it listens (PORT: the bound port, so
--port 0 picks a free one), then serves until SIGTERM or SIGINT. The
media is shared (one encoder for all clients) and keeps running while a
client reconnects. Parameter sets are in the SDP (sprop-parameter-sets);
--config-interval N also repeats them in band every N seconds (-1: with
every key frame, 0: never, the default)."""

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtsp", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtsp, GstRtspServer  # noqa: E402


def pipeline(a):
    src = (
        f"videotestsrc is-live=true pattern=ball motion=wavy ! "
        f"video/x-raw,width={a.width},height={a.height},framerate={a.fps}/1 ! videoconvert ! "
    )
    if a.codec == "h264":
        enc = (
            f"x264enc tune=zerolatency speed-preset=ultrafast key-int-max={a.fps} bitrate=500 ! "
            f"video/x-h264,profile=constrained-baseline ! "
            f"rtph264pay name=pay0 pt=96 config-interval={a.config_interval}"
        )
    elif a.codec == "mjpeg":
        enc = "video/x-raw,format=I420 ! jpegenc ! rtpjpegpay name=pay0 pt=26"
    else:
        enc = (
            f"x265enc tune=zerolatency speed-preset=ultrafast key-int-max={a.fps} bitrate=500 ! "
            f"rtph265pay name=pay0 pt=96 config-interval={a.config_interval}"
        )
    audio = ""
    if a.audio:
        audio = " audiotestsrc is-live=true ! audio/x-raw,rate=8000,channels=1 ! alawenc ! rtppcmapay name=pay1"
    return "( " + src + enc + audio + " )"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--path", default="/x")
    p.add_argument("--codec", choices=["h264", "h265", "mjpeg"], default="h264")
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--height", type=int, default=240)
    p.add_argument("--fps", type=int, default=15)
    p.add_argument("--config-interval", type=int, default=0)
    p.add_argument("--in-band", action="store_true", help="parameter sets in band with every key frame (--config-interval -1)")
    p.add_argument("--audio", action="store_true", help="add a G.711 audio track")
    p.add_argument("--user", default="")
    p.add_argument("--password", default="")
    p.add_argument("--auth", choices=["basic", "digest"], default="basic")
    a = p.parse_args()
    if a.in_band:
        a.config_interval = -1

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(a.port))

    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(pipeline(a))
    factory.set_shared(True)

    if a.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "camera-user")
        if a.auth == "digest":
            auth.set_supported_methods(GstRtsp.RTSPAuthMethod.DIGEST)
            auth.add_digest(a.user, a.password, token)
        else:
            auth.add_basic(GstRtspServer.RTSPAuth.make_basic(a.user, a.password), token)
        server.set_auth(auth)
        perms = GstRtspServer.RTSPPermissions()
        perms.add_role_from_structure(
            Gst.Structure.new_from_string(
                "camera-user, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"
            )
        )
        factory.set_permissions(perms)

    server.get_mount_points().add_factory(a.path, factory)
    if server.attach(None) == 0:
        print(f"camera.py: cannot listen on 127.0.0.1:{a.port}", file=sys.stderr)
        sys.exit(1)

    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    print(f"ready {server.get_bound_port()}", flush=True)
    loop.run()


if __name__ == "__main__":
    main()
