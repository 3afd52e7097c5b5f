package outputs

import (
	"fmt"
	"strings"
)

// Template is a parsed topic or subject template: literal text and the
// placeholders {app}, {stream} and {kind}, each replaced by the message's
// field as the transport makes it safe (Render's sanitize).
type Template []segment

type segment struct {
	lit   string
	field string // "app", "stream", "kind"; "" for a literal
}

// ParseTemplate parses s; what names it in errors ("mqtt: topic").
// Braces are only for placeholders.
func ParseTemplate(what, s string) (Template, error) {
	var tpl Template
	for rest := s; rest != ""; {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			tpl = append(tpl, segment{lit: rest})
			break
		}
		if rest[i] == '}' {
			return nil, fmt.Errorf("%s %q: '}' without '{'", what, s)
		}
		if i > 0 {
			tpl = append(tpl, segment{lit: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("%s %q: '{' without '}'", what, s)
		}
		name := rest[i+1 : i+j]
		switch name {
		case "app", "stream", "kind":
		default:
			return nil, fmt.Errorf("%s %q: unknown placeholder {%s} (known: {app}, {stream}, {kind})", what, s, name)
		}
		tpl = append(tpl, segment{field: name})
		rest = rest[i+j+1:]
	}
	if len(tpl) == 0 {
		return nil, fmt.Errorf("%s: empty", what)
	}
	return tpl, nil
}

// Render is the template for m, each field passed through sanitize.
func (tpl Template) Render(m Message, sanitize func(string) string) string {
	var b strings.Builder
	for _, s := range tpl {
		switch s.field {
		case "":
			b.WriteString(s.lit)
		case "app":
			b.WriteString(sanitize(m.App))
		case "stream":
			b.WriteString(sanitize(m.Stream))
		case "kind":
			b.WriteString(sanitize(m.Kind))
		}
	}
	return b.String()
}
