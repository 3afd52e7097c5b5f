package main

import (
	"fmt"
	"io"
	"time"

	"github.com/mdag/mdag/internal/pki"
)

// runCerts is `mdag certs init|issue`: the CA and the certificates of
// mutual TLS on the coordinator's gRPC port.
func runCerts(args []string, stdout, stderr io.Writer) int {
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "Usage: mdag certs init --dir DIR [--hosts NAMES] [--valid D] [--force]")
		fmt.Fprintln(w, "       mdag certs issue --dir DIR --role coordinator|worker|source [--name NAME] [--hosts NAMES] [--out DIR] [--valid D] [--force]")
		fmt.Fprintln(w, "\ninit creates a CA (ca.pem, ca-key.pem) and one certificate per role (coordinator.pem, worker.pem, source.pem,")
		fmt.Fprintln(w, "each with ROLE-key.pem) in DIR; issue signs another with DIR's CA. Keys are written 0600. Run 'mdag certs init -h'.")
	}
	if len(args) == 0 {
		usage(stderr)
		return exitInvalid
	}
	switch args[0] {
	case "init":
		return runCertsInit(args[1:], stdout, stderr)
	case "issue":
		return runCertsIssue(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "mdag certs: unknown subcommand %q: want init or issue\n", args[0])
	usage(stderr)
	return exitInvalid
}

func runCertsInit(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("certs init", "--dir DIR [flags]", stderr)
	dir := fs.String("dir", "", "directory to create the CA and certificates in (required; created 0700)")
	hosts := fs.String("hosts", pki.DefaultHosts, "the coordinator certificate's DNS names and IPs, comma-separated: every name workers and sources dial it by")
	valid := fs.Duration("valid", pki.DefaultCertValid, "how long the certificates are valid (the CA: 10 years)")
	force := fs.Bool("force", false, "replace existing files (a new CA: every peer needs the new files)")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "mdag certs init: --dir is required")
		return exitInvalid
	}
	if *valid <= 0 {
		fmt.Fprintf(stderr, "mdag certs init: --valid %v: want > 0\n", *valid)
		return exitInvalid
	}
	wrote, err := pki.Init(*dir, pki.InitOptions{Hosts: *hosts, Now: time.Now(), Valid: *valid, Force: *force})
	if err != nil {
		fmt.Fprintf(stderr, "mdag certs init: %v\n", err)
		return exitInvalid
	}
	for _, f := range wrote {
		fmt.Fprintln(stdout, "wrote", f)
	}
	fmt.Fprintf(stdout, "the coordinator's certificate names %s; run coordinator, workers and sources with --tls-dir %s\n", *hosts, *dir)
	fmt.Fprintf(stdout, "keep %s/ca-key.pem off the servers: only mdag certs issue needs it\n", *dir)
	return exitOK
}

func runCertsIssue(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("certs issue", "--dir DIR --role ROLE [flags]", stderr)
	dir := fs.String("dir", "", "the CA's directory (ca.pem, ca-key.pem from mdag certs init; required)")
	role := fs.String("role", "", "coordinator, worker or source (required)")
	name := fs.String("name", "", "the certificate's name, in mdag://ROLE/NAME and the logs (default: the role)")
	hosts := fs.String("hosts", "", "with --role coordinator: its DNS names and IPs, comma-separated (default "+pki.DefaultHosts+")")
	out := fs.String("out", "", "directory to write ROLE.pem, ROLE-key.pem and a copy of ca.pem to (default: --dir); one per machine")
	valid := fs.Duration("valid", pki.DefaultCertValid, "how long the certificate is valid (at most the CA's end)")
	force := fs.Bool("force", false, "replace existing files (rotation: running peers use them for new connections)")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *dir == "" || *role == "" {
		fmt.Fprintln(stderr, "mdag certs issue: --dir and --role are required")
		return exitInvalid
	}
	r, err := pki.ParseRole(*role)
	if err != nil {
		fmt.Fprintf(stderr, "mdag certs issue: --role: %v\n", err)
		return exitInvalid
	}
	if *valid <= 0 {
		fmt.Fprintf(stderr, "mdag certs issue: --valid %v: want > 0\n", *valid)
		return exitInvalid
	}
	wrote, err := pki.IssueFiles(*dir, pki.IssueOptions{Role: r, Name: *name, Hosts: *hosts, Out: *out, Now: time.Now(), Valid: *valid, Force: *force})
	if err != nil {
		fmt.Fprintf(stderr, "mdag certs issue: %v\n", err)
		return exitInvalid
	}
	for _, f := range wrote {
		fmt.Fprintln(stdout, "wrote", f)
	}
	return exitOK
}
