package rtsp

import (
	"fmt"
	"os"
	"strings"

	"github.com/mdag/mdag/internal/yamlx"
)

// camerasDoc is cameras.yaml.
type camerasDoc struct {
	Cameras []*cameraDoc `yaml:"cameras"`
}

type cameraDoc struct {
	Name      string  `yaml:"name"`
	URL       string  `yaml:"url"`
	App       string  `yaml:"app"`
	FPS       float64 `yaml:"fps"`
	Transport string  `yaml:"transport"`
}

// ParseCameras reads and checks a cameras file (DecodeCameras, with the
// process environment for ${VAR}).
func ParseCameras(path string, apps []string) ([]Camera, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cameras file: %w", err)
	}
	return DecodeCameras(path, b, apps, os.LookupEnv)
}

// DecodeCameras decodes a cameras file strictly and checks every camera:
// each problem (unknown or duplicate field, wrong type, missing or
// duplicate name, bad URL or scheme, an app that is not deployed, a bad
// fps or transport) is reported with file:line and field path, all at
// once. apps are the deployed apps: a camera without an app takes the only
// one. ${VAR} in a URL is replaced by the environment variable VAR (looked
// up with env; nil: none), so the password need not be in the file; a
// variable that is not set is an error. Messages never contain a password.
func DecodeCameras(file string, data []byte, apps []string, env func(string) (string, bool)) ([]Camera, error) {
	var d camerasDoc
	pos, errs := yamlx.Decode(file, data, &d)
	if len(errs) == 0 && len(d.Cameras) == 0 {
		errs = append(errs, pos.Errorf("cameras", "no cameras (want cameras: [{name: door, url: rtsp://host/path, app: APP}])"))
	}
	var sem yamlx.ErrorList
	names := map[string]string{} // name -> path of its first use
	var out []Camera
	for i, c := range d.Cameras {
		p := fmt.Sprintf("cameras[%d]", i)
		if c == nil {
			sem = append(sem, pos.Errorf(p, "empty entry"))
			continue
		}
		ok := true
		bad := func(field, format string, args ...any) {
			sem = append(sem, pos.Errorf(p+"."+field, format, args...))
			ok = false
		}
		if err := CheckName(c.Name); err != nil {
			bad("name", "%v", err)
		} else if first, dup := names[c.Name]; dup {
			bad("name", "%q is already the name of %s (line %d): names are stream IDs, give each camera its own", c.Name, first, pos.Line(first+".name"))
		} else {
			names[c.Name] = p
		}
		raw, err := expand(c.URL, env)
		if err != nil {
			bad("url", "%v", err)
		} else if _, err := ParseURL(raw); err != nil {
			bad("url", "%v", err)
		}
		app := c.App
		switch {
		case app == "" && len(apps) == 1:
			app = apps[0]
		case app == "":
			bad("app", "missing: the deployed app the camera streams into (one of %s)", strings.Join(apps, ", "))
		case apps != nil && !contains(apps, app):
			bad("app", "%q is not deployed (deployed: %s)%s", app, strings.Join(apps, ", "), yamlx.Suggest(app, apps))
		}
		if c.FPS < 0 || c.FPS > maxFPS {
			bad("fps", "%g: want 0 (the app's) to %d frames per second", c.FPS, maxFPS)
		}
		tr := strings.ToLower(c.Transport)
		switch tr {
		case "", "tcp", "udp":
		case "auto":
			tr = ""
		default:
			bad("transport", "%q: want tcp, udp or auto (UDP, then TCP)", c.Transport)
		}
		if ok {
			out = append(out, Camera{Name: c.Name, URL: raw, App: app, FPS: c.FPS, Transport: tr})
		}
	}
	all := errs.Merge(sem)
	all.Sort()
	if err := all.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// expand replaces ${VAR} in s with the environment's VAR. A '$' not
// followed by '{' stays as it is (passwords may hold one).
func expand(s string, env func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("%s: an unclosed ${ (want ${VARIABLE})", Redact(s))
		}
		name := s[i+2 : i+end]
		if !envName(name) {
			// Not shown: it may be part of a password holding "${".
			return "", fmt.Errorf("a ${...} that is not a variable name (want ${NAME}: letters, digits and _); a '$' in a password followed by '{' must be percent-encoded (%%24)")
		}
		if env == nil {
			return "", fmt.Errorf("${%s}: no environment to expand it from", name)
		}
		v, ok := env(name)
		if !ok {
			return "", fmt.Errorf("${%s} is not set in the environment", name)
		}
		b.WriteString(v)
		s = s[i+end+1:]
	}
}

func envName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9' {
			continue
		}
		return false
	}
	return true
}
