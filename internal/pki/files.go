package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The files of a certificate directory: the CA's certificate (ca.pem, which
// every peer needs) and key (ca-key.pem, which only `mdag certs` needs:
// keep it off the servers), and per role ROLE.pem and ROLE-key.pem.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// Files names one peer's TLS material.
type Files struct {
	CA, Cert, Key string
}

// DirFiles is role's material in dir by convention: ca.pem, ROLE.pem,
// ROLE-key.pem.
func DirFiles(dir string, role Role) Files {
	return Files{CA: filepath.Join(dir, CAFile), Cert: filepath.Join(dir, string(role)+".pem"), Key: filepath.Join(dir, string(role)+"-key.pem")}
}

// Default validities.
const (
	DefaultCAValid   = 10 * 365 * 24 * time.Hour
	DefaultCertValid = 365 * 24 * time.Hour
)

// InitOptions configure Init.
type InitOptions struct {
	// Hosts are the coordinator certificate's names (ParseHosts);
	// empty: DefaultHosts.
	Hosts string
	// Now is when the certificates start (back-dated by Skew); zero: now.
	Now time.Time
	// CAValid and Valid: the CA's and the certificates' validity; 0: the
	// defaults.
	CAValid, Valid time.Duration
	// Force overwrites existing files.
	Force bool
}

// Init creates dir (0700) with a new CA and one certificate per role:
// coordinator (named "coordinator", for Hosts), worker ("worker") and
// source ("source"), so that one directory runs a whole deployment on one
// machine. It returns the files written. Without Force it writes nothing
// when any of them exists.
func Init(dir string, o InitOptions) ([]string, error) {
	if o.Hosts == "" {
		o.Hosts = DefaultHosts
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.CAValid == 0 {
		o.CAValid = DefaultCAValid
	}
	if o.Valid == 0 {
		o.Valid = DefaultCertValid
	}
	dns, ips, err := ParseHosts(o.Hosts)
	if err != nil {
		return nil, err
	}
	ca, err := NewCA("mdag CA", o.Now, o.CAValid)
	if err != nil {
		return nil, err
	}
	caKey, err := KeyPEM(ca.Key)
	if err != nil {
		return nil, err
	}
	out := []file{{CAFile, CertPEM(ca.Cert), 0o644, false}, {CAKeyFile, caKey, 0o600, false}}
	for _, r := range Roles {
		req := Request{Role: r, Name: string(r), Now: o.Now, Valid: o.Valid}
		if r == Coordinator {
			req.DNS, req.IPs = dns, ips
		}
		fs, err := issueFiles(ca, req)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r, err)
		}
		out = append(out, fs...)
	}
	return writeAll(dir, out, o.Force)
}

// IssueOptions configure IssueFiles.
type IssueOptions struct {
	Role Role
	// Name is the certificate's name (mdag://ROLE/NAME); empty: the role.
	Name string
	// Hosts: the coordinator's names (ParseHosts); empty: DefaultHosts.
	// Refused for the other roles.
	Hosts string
	// Out is where ROLE.pem and ROLE-key.pem go, with a copy of ca.pem
	// when it is not the CA's directory; empty: the CA's directory.
	Out string
	// Now is when the certificate starts (back-dated by Skew); zero: now.
	Now   time.Time
	Valid time.Duration
	Force bool
}

// IssueFiles signs one certificate with the CA in dir (ca.pem,
// ca-key.pem) and writes it. It returns the files written. Without Force
// it writes nothing when the certificate or key file exists, or when
// Out holds a different ca.pem.
func IssueFiles(dir string, o IssueOptions) ([]string, error) {
	if _, err := ParseRole(string(o.Role)); err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = string(o.Role)
	}
	if o.Valid == 0 {
		o.Valid = DefaultCertValid
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.Out == "" {
		o.Out = dir
	}
	req := Request{Role: o.Role, Name: o.Name, Now: o.Now, Valid: o.Valid}
	if o.Role == Coordinator {
		if o.Hosts == "" {
			o.Hosts = DefaultHosts
		}
		var err error
		if req.DNS, req.IPs, err = ParseHosts(o.Hosts); err != nil {
			return nil, err
		}
	} else if o.Hosts != "" {
		return nil, fmt.Errorf("hosts are for the coordinator's certificate; a %s's certificate names no host", o.Role)
	}
	caPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		return nil, fmt.Errorf("the CA: %w (create one with mdag certs init --dir %s)", err, dir)
	}
	caKey, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("the CA's key: %w (issue where mdag certs init wrote it)", err)
	}
	ca, err := ParseCA(caPEM, caKey)
	if err != nil {
		return nil, fmt.Errorf("the CA in %s and %s: %w", caPath, keyPath, err)
	}
	out, err := issueFiles(ca, req)
	if err != nil {
		return nil, err
	}
	if !sameDir(o.Out, dir) {
		out = append(out, file{CAFile, caPEM, 0o644, false})
		// An identical ca.pem is no conflict (several roles issued into
		// one directory).
		if old, err := os.ReadFile(filepath.Join(o.Out, CAFile)); err == nil && bytes.Equal(old, caPEM) {
			out[len(out)-1].same = true
		}
	}
	return writeAll(o.Out, out, o.Force)
}

func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ia, err1 := os.Stat(a)
	ib, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(ia, ib)
}

type file struct {
	name string
	data []byte
	perm fs.FileMode
	same bool // already there with this content: skipped
}

func issueFiles(ca *CA, req Request) ([]file, error) {
	c, err := ca.Issue(req)
	if err != nil {
		return nil, err
	}
	key, err := KeyPEM(c.Key)
	if err != nil {
		return nil, err
	}
	return []file{{string(req.Role) + ".pem", CertPEM(c.Cert), 0o644, false}, {string(req.Role) + "-key.pem", key, 0o600, false}}, nil
}

// writeAll writes files into dir, refusing before writing any when one
// exists (unless force). Each file is written whole under a temporary
// name and renamed, so a peer re-reading the directory never sees half a
// file.
func writeAll(dir string, files []file, force bool) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if !force {
		var exist []string
		for _, f := range files {
			p := filepath.Join(dir, f.name)
			if _, err := os.Lstat(p); err == nil && !f.same {
				exist = append(exist, p)
			} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
		}
		if len(exist) > 0 {
			return nil, fmt.Errorf("refusing to overwrite %s: give --force to replace (peers pick up new files on their next connection)", strings.Join(exist, ", "))
		}
	}
	var wrote []string
	for _, f := range files {
		if f.same {
			continue
		}
		p := filepath.Join(dir, f.name)
		if err := writeAtomic(p, f.data, f.perm); err != nil {
			return wrote, err
		}
		wrote = append(wrote, p)
	}
	return wrote, nil
}

func writeAtomic(path string, data []byte, perm fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
