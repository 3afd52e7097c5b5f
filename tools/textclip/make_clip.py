#!/usr/bin/python3
"""Write the text-reader test clip: known strings on signs moving over opencv-doc's vtest.avi.

usage: make_clip.py OUTDIR   (writes OUTDIR/text-clip.avi and OUTDIR/text-clip.json)

Every frame of the first FRAMES frames of vtest.avi (768x576, 10 frames/s; Debian's opencv-doc) is
scaled to 640x480 and gets SIGNS signs: a light plate with a dark border and one line of text in
DejaVu Sans Bold (Debian's fonts-dejavu-core), each moving on its own straight path and changing its
string every HOLD frames (the strings of STRINGS in turn: plates, signs, labels). The video is
Motion JPEG in AVI at quality 2 (near lossless; OpenCV and the Go test read it). The ground truth,
per frame, is in text-clip.json: {"frames": [{"frame": 0, "texts": [{"text", "x", "y", "w", "h"}]}]}
with the plate's box in frame pixels. Deterministic: no randomness; the same Debian packages
(python3-av, python3-pil, fonts-dejavu-core, opencv-doc) give the same file.
"""
import json
import os
import sys

import av
import av.logging
from PIL import Image, ImageDraw, ImageFont

SOURCE = "/usr/share/doc/opencv-doc/examples/data/vtest.avi"
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"
W, H = 640, 480
FPS = 10
FRAMES = 120
HOLD = 20  # frames a sign keeps its string
SIGNS = [
    # start (x, y), velocity (px/frame), font size, plate colour, text colour
    ((20, 40), (2.0, 0.6), 30, (250, 250, 245), (20, 20, 20)),
    ((380, 200), (-1.6, 0.4), 26, (255, 214, 0), (10, 10, 10)),
    ((60, 380), (1.2, -0.8), 28, (235, 240, 255), (0, 40, 120)),
]
# Plates, signs and labels: capitals, digits and a few marks (what PP-OCR's keys hold), no
# characters that DejaVu draws alike (0/O, 1/I) next to each other in one string.
STRINGS = [
    ["KX 4071", "EXIT 24", "PLATFORM 3", "BUS 52A", "GATE B7", "ROUTE 66"],
    ["SALE 50%", "OPEN", "NO PARKING", "STOP", "CAFE", "HOTEL"],
    ["LOT 8841", "AB-2093", "BATCH 77", "SIZE M", "PRICE 4.99", "ZONE C"],
]


def sign_image(text, size, plate, ink):
    font = ImageFont.truetype(FONT, size)
    left, top, right, bottom = font.getbbox(text)
    pad_x, pad_y = size // 2, size // 3
    w, h = right - left + 2 * pad_x, bottom - top + 2 * pad_y
    img = Image.new("RGB", (w, h), plate)
    d = ImageDraw.Draw(img)
    d.rectangle([0, 0, w - 1, h - 1], outline=(40, 40, 40), width=2)
    d.text((pad_x - left, pad_y - top), text, font=font, fill=ink)
    return img


def bounce(p, v, lo, hi):
    """Position p moving at v inside [lo, hi], reflecting at the ends."""
    span = hi - lo
    if span <= 0:
        return lo
    q = (p - lo) % (2 * span)
    return lo + (q if q <= span else 2 * span - q)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    av.logging.set_level(av.logging.ERROR)  # not libswscale's yuvj420p range notice, once a frame
    os.makedirs(out, exist_ok=True)
    src = av.open(SOURCE)
    tmp = os.path.join(out, "text-clip.avi.tmp")
    dst = av.open(tmp, "w", format="avi")
    st = dst.add_stream("mjpeg", rate=FPS)
    st.width, st.height, st.pix_fmt = W, H, "yuvj420p"
    st.options = {"qmin": "2", "qmax": "2"}
    truth = []
    n = 0
    for frame in src.decode(video=0):
        if n == FRAMES:
            break
        img = frame.to_image().resize((W, H), Image.BILINEAR)
        texts = []
        for i, ((x0, y0), (vx, vy), size, plate, ink) in enumerate(SIGNS):
            text = STRINGS[i][(n // HOLD) % len(STRINGS[i])]
            s = sign_image(text, size, plate, ink)
            x = int(round(bounce(x0 + vx * n, vx, 0, W - s.width)))
            y = int(round(bounce(y0 + vy * n, vy, 0, H - s.height)))
            img.paste(s, (x, y))
            texts.append({"text": text, "x": x, "y": y, "w": s.width, "h": s.height})
        truth.append({"frame": n, "texts": texts})
        vf = av.VideoFrame.from_image(img).reformat(format="yuvj420p")
        for p in st.encode(vf):
            dst.mux(p)
        n += 1
    for p in st.encode():
        dst.mux(p)
    dst.close()
    src.close()
    os.replace(tmp, os.path.join(out, "text-clip.avi"))
    with open(os.path.join(out, "text-clip.json"), "w") as fh:
        json.dump({"source": os.path.basename(SOURCE), "font": os.path.basename(FONT), "width": W, "height": H, "fps": FPS,
                   "frames": truth}, fh, indent=None, separators=(",", ":"))
        fh.write("\n")
    print(f"{out}/text-clip.avi: {n} frames {W}x{H} at {FPS}/s, {len(SIGNS)} signs a frame; truth in {out}/text-clip.json")


if __name__ == "__main__":
    main()
