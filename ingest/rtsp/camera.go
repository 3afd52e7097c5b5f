package rtsp

import (
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// Camera is one RTSP camera to read.
type Camera struct {
	// Name is the stream's ID in status and results: unique, matching
	// [a-z0-9][a-z0-9_-]*.
	Name string
	// URL is rtsp:// or rtsps://, with user:password@ when the camera
	// asks for basic or digest authentication. It is secret: it is never
	// logged or shown; Source is.
	URL string
	// App is the deployed app the camera's stream joins.
	App string
	// FPS is the rate frames are sampled at (0: the app's).
	FPS float64
	// Transport is "tcp", "udp" or "" (auto: UDP, then TCP when no UDP
	// packet arrives).
	Transport string
}

// Source is the camera's URL without its user and password: what status,
// logs and errors show.
func (c Camera) Source() string { return Redact(c.URL) }

// Transports are the values Camera.Transport takes ("auto" is "").
var Transports = []string{"tcp", "udp", "auto"}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// maxNameLen bounds a camera name (it is a stream ID in status and labels).
const maxNameLen = 64

// CheckName says what is wrong with a camera name, or nil.
func CheckName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("missing: a name for the camera ([a-z0-9][a-z0-9_-]*)")
	case len(name) > maxNameLen:
		return fmt.Errorf("%q is longer than %d characters", name, maxNameLen)
	case !nameRE.MatchString(name):
		return fmt.Errorf("%q: want lower-case letters, digits, '-' and '_', starting with a letter or digit", name)
	}
	return nil
}

// ParseURL checks a camera URL: rtsp:// or rtsps://, a host, a port in
// 1..65535 if one is given, no fragment. Its errors never contain the
// password: they show the URL with the user information removed.
func ParseURL(raw string) (*url.URL, error) {
	shown := Redact(raw)
	if raw == "" {
		return nil, fmt.Errorf("missing: the camera's URL (rtsp://[user:password@]host[:port]/path)")
	}
	if strings.ContainsAny(raw, " \t\r\n") {
		return nil, fmt.Errorf("%s: a URL has no spaces", shown)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the whole URL, password included: say
		// what is wrong without it.
		return nil, fmt.Errorf("%s: not a URL (want rtsp://[user:password@]host[:port]/path)", shown)
	}
	switch strings.ToLower(u.Scheme) {
	case "rtsp", "rtsps":
	case "":
		return nil, fmt.Errorf("%s: no scheme: want rtsp:// or rtsps://", shown)
	default:
		return nil, fmt.Errorf("%s: scheme %q: want rtsp:// or rtsps://", shown, u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%s: no host (want rtsp://[user:password@]host[:port]/path)", shown)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s: port %q: want 1..65535", shown, p)
		}
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return nil, fmt.Errorf("%s: a camera URL has no #fragment", shown)
	}
	if u.User != nil && u.User.Username() == "" {
		if _, ok := u.User.Password(); ok {
			return nil, fmt.Errorf("%s: a password without a user", shown)
		}
	}
	return u, nil
}

// Redact is raw without its user information (user:password@): what may be
// shown. It works on strings that do not parse as URLs too.
func Redact(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		// No scheme: an '@' before the first '/' still marks user info.
		return cutUserinfo(raw, 0)
	}
	return cutUserinfo(raw, i+3)
}

// cutUserinfo removes what lies between from and the last '@' of the
// authority (the authority ends at the first '/', '?' or '#' after from).
func cutUserinfo(raw string, from int) string {
	rest := raw[from:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return raw
	}
	return raw[:from] + rest[at+1:]
}

// secrets is what must never be shown of a URL: its password and its
// whole user information (a user name alone is not secret, but "user:pass"
// in any form is).
func secrets(raw string) []string {
	var out []string
	u, err := url.Parse(raw)
	if err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			out = append(out, p)
			if esc := url.QueryEscape(p); esc != p {
				out = append(out, esc)
			}
			if esc := url.PathEscape(p); esc != p {
				out = append(out, esc)
			}
		}
	}
	// The raw user information, whether or not it parsed.
	if i := strings.Index(raw, "://"); i >= 0 {
		rest := raw[i+3:]
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			info := rest[:at]
			if _, pass, ok := strings.Cut(info, ":"); ok && pass != "" {
				out = append(out, pass)
			}
		}
	}
	return out
}

// scrub replaces every secret in s: the last defence for error texts that
// come from libraries.
func scrub(s string, secret []string) string {
	for _, p := range secret {
		if p != "" {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return s
}

// ParseFlag reads one --camera value: URL or NAME=URL. Without a name the
// camera is named after its host, port (when not 554) and path, e.g.
// rtsp://10.0.0.5/stream1 -> "10-0-0-5-stream1". app and fps are the
// camera's app and rate (--app, --fps).
func ParseFlag(v, app string, fps float64) (Camera, error) {
	name, raw := "", v
	if i := strings.Index(v, "="); i > 0 && !strings.Contains(v[:i], "://") {
		name, raw = v[:i], v[i+1:]
		if err := CheckName(name); err != nil {
			return Camera{}, fmt.Errorf("--camera %s: name %v", Redact(v), err)
		}
	}
	u, err := ParseURL(raw)
	if err != nil {
		return Camera{}, fmt.Errorf("--camera: %v", err)
	}
	if name == "" {
		name = NameFor(u)
	}
	return Camera{Name: name, URL: raw, App: app, FPS: fps}, nil
}

// NameFor derives a camera name from its URL's host, port (when not the
// default 554 or 322) and path.
func NameFor(u *url.URL) string {
	s := u.Hostname()
	if p := u.Port(); p != "" && p != "554" && p != "322" {
		s += "-" + p
	}
	s += "-" + u.Path
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
			continue
		}
		if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	name := strings.TrimRight(b.String(), "-")
	if len(name) > maxNameLen {
		name = strings.TrimRight(name[:maxNameLen], "-")
	}
	if name == "" {
		return "camera"
	}
	return name
}

// Check checks a list of cameras as Start takes it: each name, URL and
// transport, unique names, an app for each. apps, when not nil, are the
// deployed apps.
func Check(cams []Camera, apps []string) error {
	seen := map[string]bool{}
	for _, c := range cams {
		if err := CheckName(c.Name); err != nil {
			return fmt.Errorf("camera %s: name %v", c.Name, err)
		}
		if seen[c.Name] {
			return fmt.Errorf("camera %s: two cameras have this name (names are stream IDs: give each its own)", c.Name)
		}
		seen[c.Name] = true
		if _, err := ParseURL(c.URL); err != nil {
			return fmt.Errorf("camera %s: %v", c.Name, err)
		}
		if c.App == "" {
			return fmt.Errorf("camera %s: no app", c.Name)
		}
		if apps != nil && !contains(apps, c.App) {
			return fmt.Errorf("camera %s: app %q is not deployed (deployed: %s)", c.Name, c.App, strings.Join(apps, ", "))
		}
		if c.FPS < 0 || c.FPS > maxFPS {
			return fmt.Errorf("camera %s: fps %g: want 0 (the app's) to %d", c.Name, c.FPS, maxFPS)
		}
		switch c.Transport {
		case "", "tcp", "udp", "auto":
		default:
			return fmt.Errorf("camera %s: transport %q: want tcp, udp or auto", c.Name, c.Transport)
		}
	}
	return nil
}

// maxFPS bounds a camera's sampling rate.
const maxFPS = 240

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
