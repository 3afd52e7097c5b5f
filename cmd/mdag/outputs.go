package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/outputs"
	"github.com/mdag/mdag/outputs/mqtt"
	"github.com/mdag/mdag/outputs/nats"
	"github.com/mdag/mdag/outputs/spool"
	"github.com/mdag/mdag/outputs/webhook"
)

// startOutputs opens the app's outputs (its `outputs:`): each one's spool
// (under the output's spool.dir, else stateDir's outputs/APP/NAME, else
// the user's cache directory's mdag/outputs/APP/NAME) and transport, and
// starts their hub. nil when the app has none.
func startOutputs(app *dag.App, stateDir string, log *slog.Logger) (*outputs.Hub, error) {
	if len(app.Outputs) == 0 {
		return nil, nil
	}
	if err := checkOutputs(app); err != nil {
		return nil, err
	}
	var outs []outputs.Output
	fail := func(err error) (*outputs.Hub, error) {
		for _, o := range outs {
			o.Spool.Close()
			o.Transport.Close()
		}
		return nil, err
	}
	for i, spec := range app.Outputs {
		at := fmt.Sprintf("%s: outputs[%d] (%s)", app.File, i, spec.Name)
		tr, err := transport(app, spec)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", at, err))
		}
		dir, err := spoolDir(app, spec, stateDir)
		if err != nil {
			tr.Close()
			return fail(fmt.Errorf("%s: spool: %w", at, err))
		}
		sp, err := spool.Open(spool.Options{Dir: dir, MaxBytes: int64(spec.Spool.MaxBytes), MaxAge: spec.Spool.MaxAge, WhenFull: spool.Policy(spec.Spool.WhenFull)})
		if err != nil {
			tr.Close()
			return fail(fmt.Errorf("%s: spool: %w", at, err))
		}
		if st := sp.Stats(); st.Waiting > 0 || st.Corrupt > 0 {
			log.Info("output spool opened with messages from before: they are sent first", "output", spec.Name, "dir", dir, "waiting", st.Waiting, "corrupt_skipped", st.Corrupt)
		}
		o := outputs.Output{Name: spec.Name, Kinds: spec.Send, Every: spec.Every, Transport: tr, Spool: sp}
		if w := spec.Webhook; w != nil {
			o.SendTimeout = max(30*time.Second, 2*w.Timeout) // a batch has time for at least one slow answer
		}
		outs = append(outs, o)
		log.Info("output", "name", spec.Name, "to", tr.Describe(), "send", strings.Join(spec.Send, ","), "spool", dir,
			"spool_max", spec.Spool.MaxBytes.String(), "spool_max_age", spec.Spool.MaxAge, "when_full", spec.Spool.WhenFull)
	}
	h, err := outputs.Start(outputs.Config{App: string(app.Name), Outputs: outs, Clock: clock.Real{}, Log: log})
	if err != nil {
		return fail(err)
	}
	return h, nil
}

// checkOutputs builds each output's transport as serve will (without
// reading its secret and TLS files), and refuses two outputs sharing a
// spool directory: what validates, starts.
func checkOutputs(app *dag.App) error {
	var bad []string
	at := func(i int, field string) string {
		path := fmt.Sprintf("outputs[%d]%s", i, field)
		line := 0
		if p := app.Positions(); p != nil {
			line = p.Line(path)
		}
		return fmt.Sprintf("%s:%d: %s", app.File, line, path)
	}
	dirs := map[string]int{}
	for i, o := range app.Outputs {
		tr, err := transportOf(app, o, false)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", at(i, ""), err))
		} else {
			tr.Close()
		}
		if d, err := spoolDir(app, o, ""); err == nil {
			if j, dup := dirs[filepath.Clean(d)]; dup {
				bad = append(bad, fmt.Sprintf("%s: %s is outputs[%d]'s spool too: each output needs its own", at(i, ".spool.dir"), d, j))
			}
			dirs[filepath.Clean(d)] = i
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "\n"))
	}
	return nil
}

// spoolDir is where an output's spool lives.
func spoolDir(app *dag.App, o dag.Output, stateDir string) (string, error) {
	if o.Spool.Dir != "" {
		return appPath(app, o.Spool.Dir), nil
	}
	if stateDir != "" {
		return filepath.Join(stateDir, "outputs", string(app.Name), o.Name), nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no spool.dir, no --state and %v", err)
	}
	return filepath.Join(cache, "mdag", "outputs", string(app.Name), o.Name), nil
}

// appPath is p relative to the app file's directory (as written, for an
// app built in).
func appPath(app *dag.App, p string) string {
	if p == "" || filepath.IsAbs(p) || app.File == "" {
		return p
	}
	return filepath.Join(filepath.Dir(app.File), p)
}

// secret is a file's first line (a password, a token, an HMAC key).
func secret(app *dag.App, path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(appPath(app, path))
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimRight(line, "\r")
	if line == "" {
		return "", fmt.Errorf("%s: empty (the secret is the file's first line)", path)
	}
	return line, nil
}

// tlsConfig is a client TLS configuration from t's files.
func tlsConfig(app *dag.App, t dag.TLS) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(appPath(app, t.CAFile))
		if err != nil {
			return nil, err
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_file %s: no PEM certificate", t.CAFile)
		}
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(appPath(app, t.CertFile), appPath(app, t.KeyFile))
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// transport builds the output's transport; it connects on first use.
func transport(app *dag.App, o dag.Output) (outputs.Transport, error) {
	return transportOf(app, o, true)
}

// transportOf builds the output's transport; without files, its secret
// and TLS files are not read (placeholders stand in: validate checks the
// rest as the transport will).
func transportOf(app *dag.App, o dag.Output, files bool) (outputs.Transport, error) {
	secret := secret
	tlsConfig := tlsConfig
	if !files {
		secret = func(_ *dag.App, path string) (string, error) {
			if path == "" {
				return "", nil
			}
			return "x", nil
		}
		tlsConfig = func(*dag.App, dag.TLS) (*tls.Config, error) { return &tls.Config{MinVersion: tls.VersionTLS12}, nil }
	}
	switch {
	case o.MQTT != nil:
		m := o.MQTT
		pw, err := secret(app, m.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("mqtt.password_file: %w", err)
		}
		var tc *tls.Config
		if strings.HasPrefix(m.URL, "mqtts:") {
			if tc, err = tlsConfig(app, m.TLS); err != nil {
				return nil, fmt.Errorf("mqtt.%w", err)
			}
		}
		return mqtt.New(mqtt.Config{URL: m.URL, Version: m.Version, QoS0: *m.QoS == 0, Topic: m.Topic, ClientID: m.ClientID, Username: m.Username, Password: pw, TLS: tc})
	case o.NATS != nil:
		n := o.NATS
		pw, err := secret(app, n.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("nats.password_file: %w", err)
		}
		tok, err := secret(app, n.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("nats.token_file: %w", err)
		}
		var tc *tls.Config
		if strings.HasPrefix(n.URL, "tls:") {
			if tc, err = tlsConfig(app, n.TLS); err != nil {
				return nil, fmt.Errorf("nats.%w", err)
			}
		}
		return nats.New(nats.Config{URL: n.URL, Subject: n.Subject, JetStream: n.JetStream, Username: n.Username, Password: pw, Token: tok, TLS: tc})
	case o.Webhook != nil:
		w := o.Webhook
		key, err := secret(app, w.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("webhook.secret_file: %w", err)
		}
		var tc *tls.Config
		if strings.HasPrefix(w.URL, "https:") {
			if tc, err = tlsConfig(app, w.TLS); err != nil {
				return nil, fmt.Errorf("webhook.%w", err)
			}
		}
		return webhook.New(webhook.Config{URL: w.URL, Secret: []byte(key), Timeout: w.Timeout, Headers: w.Headers, TLS: tc})
	}
	return nil, fmt.Errorf("no mqtt, nats or webhook")
}

// outputResult is an engine result as the outputs take it.
func outputResult(r coordinator.FrameResult) outputs.Result {
	return outputs.Result{App: string(r.App), Stream: r.Stream, Seq: r.Seq, Outcome: string(r.Outcome), Latency: r.Latency,
		Module: string(r.Module), Reason: string(r.Reason), Boxes: r.Boxes, Labels: r.Labels, Counts: r.Counts, Tracks: r.Tracks,
		Events: r.Events, Finished: r.Finished}
}

// writeOutputLines is serve's and the coordinator's summary of the
// outputs: per output, what was delivered, what waits and what was lost.
func writeOutputLines(w io.Writer, h *outputs.Hub) {
	if h == nil {
		return
	}
	for _, s := range h.Status() {
		state := "up"
		if !s.Connected {
			state = "DOWN: " + s.LastError
		}
		fmt.Fprintf(w, "output %s -> %s: %d delivered, %d retries, %d waiting in the spool, %d lost (rejected %d, full %d, expired %d, busy %d, corrupt %d, unspooled %d); %s\n",
			s.Name, s.To, s.Published, s.Retried, s.Waiting, s.Dropped(), s.Rejected, s.DroppedFull, s.Expired, s.DroppedBusy, s.Corrupt, s.Unspooled, state)
	}
}
