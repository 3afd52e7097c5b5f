package rtsp

import (
	"fmt"
	"net/url"
	"os"
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
// password: they show the URL with the user information removed, and a
// URL that does not parse, or whose user information cannot be told from
// its host without doubt, is not shown at all ("rtsp:// URL (URL hidden:
// ...)").
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
		if !strings.Contains(raw, "@") {
			// No user information, so no password: show it.
			return nil, fmt.Errorf("%s: %s (want rtsp://[user:password@]host[:port]/path)", raw, parseProblem(err))
		}
		// url.Parse's error quotes the whole URL, password included, and
		// so may Redact's text: a password holding '/', '?' or '#' ends
		// the host part early for url.Parse. Show neither.
		return nil, hiddenErr(raw, parseProblem(err))
	}
	if u.Host != "" {
		// The host url.Parse found must be the one Redact keeps: else
		// (rtsp://admin:1234/pw@cam/x parses with host "admin:1234")
		// what Redact shows and what gortsplib dials differ, and one of
		// them holds the password.
		if ru, err := url.Parse(shown); err != nil || ru.Host != u.Host {
			return nil, hiddenErr(raw, "an '@' after the host part")
		}
	}
	if u.User != nil && strings.Count(authority(raw), "@") > 1 {
		// url.Parse takes the last '@' as the end of the user
		// information; a reader, or another parser, may take the first.
		return nil, rawAtErr(raw)
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

// hiddenErr is the error for a URL with user information that is not
// shown: its scheme, what is wrong, and that a password with '/', '?', '#'
// or '@' must be percent-encoded.
func hiddenErr(raw, problem string) error {
	return fmt.Errorf("%s URL (URL hidden: it may hold the password): %s: a password holding '/', '?', '#' or '@' must be percent-encoded in a URL (RFC 3986: %%2F, %%3F, %%23, %%40)", schemeOf(raw), problem)
}

// rawAtErr is the error for a URL whose user information holds a raw
// '@': not shown (where the password ends is not clear), with the fix.
func rawAtErr(raw string) error {
	return fmt.Errorf("%s URL (URL hidden: it may hold the password): an '@' in the user or password: write it percent-encoded as %%40 "+
		"(rtsp://user:p%%40ss@host/path for the password p@ss); a raw '@' leaves unclear where the host starts", schemeOf(raw))
}

// schemeOf is raw's scheme with "://" ("rtsp://"), or "camera" when it has
// none that can be shown.
func schemeOf(raw string) string {
	if i := strings.Index(raw, "://"); i > 0 && schemeRE.MatchString(raw[:i]) {
		return strings.ToLower(raw[:i]) + "://"
	}
	return "camera"
}

// authority is the part of raw between "://" and the first '/', '?' or
// '#' after it: user information, host and port.
func authority(raw string) string {
	rest := raw
	if i := strings.Index(raw, "://"); i >= 0 {
		rest = raw[i+3:]
	}
	if end := strings.IndexAny(rest, "/?#"); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

var schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]{0,15}$`)

// parseProblem says what url.Parse found wrong without quoting any of the
// URL (its error does: the port or escape it quotes may be part of the
// password).
func parseProblem(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "invalid port"):
		return "what follows the host's ':' is not a port number"
	case strings.Contains(msg, "invalid URL escape"):
		return "a '%' not followed by two hex digits"
	case strings.Contains(msg, "invalid character") && strings.Contains(msg, "host"):
		return "a character that a host name cannot hold"
	case strings.Contains(msg, "control character"):
		return "a control character"
	case strings.Contains(msg, "missing ']'"):
		return "an IPv6 host without its closing ']'"
	case strings.Contains(msg, "missing protocol scheme"), strings.Contains(msg, "first path segment"):
		return "no scheme: want rtsp:// or rtsps://"
	}
	return "not a URL"
}

// Redact is raw without its user information (user:password@): what may be
// shown. It works on strings that do not parse as URLs too (see
// userinfoEnd for where the user information ends).
func Redact(raw string) string {
	from := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		from = i + 3
	}
	at := userinfoEnd(raw[from:])
	if at < 0 {
		return raw
	}
	return raw[:from] + raw[from+at+1:]
}

// userinfoEnd is the index in rest (a URL after "://") of the '@' that ends
// its user information, or -1. A URL's password may hold '/', '?', '#' and
// '@' only percent-encoded, but people write them raw: so when a ':' (a
// password) comes before the last '@', the user information runs to the
// LAST '@' of the URL, wherever it is; over-redacting a URL with an '@' in
// its path or query is safe (ParseURL refuses it: it cannot be told from a
// password), showing part of a password is not. Without a ':' before the
// last '@' there is no password: the authority ends at the first '/', '?'
// or '#' and its last '@' ends the user name.
func userinfoEnd(rest string) int {
	last := strings.LastIndex(rest, "@")
	if last < 0 {
		return -1
	}
	if strings.Contains(rest[:last], ":") {
		return last
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	return strings.LastIndex(rest[:end], "@")
}

// RedactText is s with the user information (user:password@) of every
// URL in it removed, and nothing else changed: error texts, library ones
// included, may quote a camera's URL. A URL is whatever follows "://"; its
// user information ends at the last '@' before the first character that
// user information cannot hold (RFC 3986 and url.Parse: letters, digits,
// "-._~!$&'()*+,;=:%" and '@'), so "rtsp://cam/x: mail admin@host" keeps
// its text. A camera's URL holds nothing else there (ParseURL refuses the
// rest), so its password goes with it, written raw or percent-encoded.
func RedactText(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			if b.Len() == 0 {
				return s
			}
			b.WriteString(s)
			return b.String()
		}
		from := i + 3
		end := from
		for end < len(s) && userinfoByte(s[end]) {
			end++
		}
		at := strings.LastIndexByte(s[from:end], '@')
		b.WriteString(s[:from])
		if at >= 0 {
			from += at + 1
		}
		s = s[from:]
	}
}

// userinfoByte says whether c may be part of a URL's user information as
// url.Parse takes it (validUserinfo), '@' included.
func userinfoByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:%@", c) >= 0
}

// ParseFlag reads one --camera value: URL or NAME=URL. Without a name the
// camera is named after its host, port (when not 554) and path, e.g.
// rtsp://10.0.0.5/stream1 -> "10-0-0-5-stream1". app and fps are the
// camera's app and rate (--app, --fps).
//
// ${VAR} in the URL is replaced by the environment's VAR, as in a cameras
// file: 'rtsp://admin:${DOOR_PASSWORD}@host/path' keeps the password off
// the command line, where every local user can read it (ps,
// /proc/PID/cmdline); PasswordInline says when a flag holds one anyway.
func ParseFlag(v, app string, fps float64) (Camera, error) {
	name, raw := "", v
	if i := strings.Index(v, "="); i > 0 && !strings.Contains(v[:i], "://") {
		name, raw = v[:i], v[i+1:]
		if err := CheckName(name); err != nil {
			return Camera{}, fmt.Errorf("--camera %s: name %v", Redact(v), err)
		}
	}
	raw, err := expand(raw, os.LookupEnv)
	if err != nil {
		return Camera{}, fmt.Errorf("--camera: %v", err)
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

// PasswordInline reports whether a --camera value carries a password
// written out rather than as ${VAR}.
func PasswordInline(v string) bool {
	i := strings.Index(v, "://")
	if i < 0 {
		return false
	}
	rest := v[i+3:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return false
	}
	if slash := strings.IndexByte(rest, '/'); slash >= 0 && slash < at {
		return false
	}
	_, pass, ok := strings.Cut(rest[:at], ":")
	return ok && pass != "" && !strings.Contains(pass, "${")
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
