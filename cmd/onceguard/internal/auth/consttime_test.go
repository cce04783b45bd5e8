package auth

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Secrets must never be compared with ==, != or a short-circuiting
// library comparison: those return at the first differing byte, so their
// timing tells an attacker how much of a guess was right. TestConstantTime
// scans the non-test Go sources of every package that handles a secret
// and fails on such a comparison of an identifier known to hold one.
//
// A secretRule names, for one package, the identifiers (variables,
// parameters, struct fields, or functions returning a secret) that hold
// secrets, in the whole package or only inside the listed functions (for
// names like got/want that are secrets in one place only).
//
// What is deliberately not listed, and why:
//   - hashes used to look a secret up (token.Hash, auth.HashToken, the
//     sessions' and submit tokens' token_hash): SHA-256 of 192+ random
//     bits, compared by a map or a database index; learning a stored
//     hash's prefix by timing does not yield the token (SECURITY.md:
//     "secrets are looked up by hash");
//   - the idempotency stores (memstore, redisstore, sqlstore): they never
//     see a raw key or token, only record ids (SHA-256 of scope and key)
//     and token hashes;
//   - lock and key-record lease/owner tokens: random values the service
//     makes and compares itself, never taken from a client;
//   - the CSRF check: it compares Origin and Sec-Fetch-Site, which are
//     public; there is no CSRF token to leak;
//   - comparisons with "" or nil (presence checks) and character-level
//     syntax checks (k[0] == '"'): they tell nothing an attacker does not
//     already know about their own input.
type secretRule struct {
	dir   string   // package directory, relative to the repository root
	funcs []string // functions (or methods) the names are secrets in; nil: the whole package
	names []string // identifiers and field or function names holding secrets
	what  string
}

var secretRules = []secretRule{
	{dir: "cmd/onceguard/internal/auth", names: []string{"password", "encoded", "token"},
		what: "raw passwords, stored argon2id strings, raw session tokens"},
	{dir: "cmd/onceguard/internal/auth", funcs: []string{"CheckPassword"}, names: []string{"got", "want"},
		what: "the derived argon2id key and the stored one: the password check itself"},
	{dir: "cmd/onceguard/internal/auth", funcs: []string{"HashPassword"}, names: []string{"key", "salt"},
		what: "a fresh argon2id key and its salt"},
	{dir: "cmd/onceguard/internal/httpapi", names: []string{"tok", "pass", "Password", "Token", "sessionToken"},
		what: "session tokens (bearer or cookie), sign-in passwords, issued submit tokens"},
	{dir: "cmd/onceguard/internal/httpapi", funcs: []string{"sessionToken"}, names: []string{"Value"},
		what: "the session cookie's value (the bearer token is tok, above)"},
	{dir: "cmd/onceguard/internal/app", names: []string{"password", "PasswordHash", "dummyHash", "token", "Token"},
		what: "sign-in and sign-up passwords, stored password hashes, session tokens"},
	{dir: "cmd/onceguard/internal/app", funcs: []string{"Authenticate", "SignUp"}, names: []string{"hash"},
		what: "the password hash a sign-in checks against or a sign-up stores"},
	{dir: "cmd/onceguard/internal/app", funcs: []string{"StartSession"}, names: []string{"tok", "th"},
		what: "the new session's token and its hash"},
	{dir: "cmd/onceguard/internal/sqlstore", names: []string{"PasswordHash"},
		what: "stored password hashes"},
	{dir: "token", names: []string{"tok", "Token"},
		what: "raw submit tokens"},
	{dir: "idempotency", names: []string{"key", "Key"},
		what: "raw Idempotency-Keys, which may be submit tokens (Call.Key: \"a secret: never log it\")"},
	{dir: "idempotency", funcs: []string{"ParseKey"}, names: []string{"k"},
		what: "the Idempotency-Key being parsed"},
}

// mustCompareConstantTime: the places that do compare secrets, and the
// constant-time call each must make (so that the comparison cannot be
// dropped or rewritten by hand without this test noticing).
var mustCompareConstantTime = []struct {
	dir, fn, call string
	args          []string
}{
	{dir: "cmd/onceguard/internal/auth", fn: "CheckPassword", call: "crypto/subtle.ConstantTimeCompare", args: []string{"got", "want"}},
}

// shortCircuit are the library comparisons that stop at the first
// difference (hmac.Equal and subtle.ConstantTimeCompare are the allowed
// ones). strings.HasPrefix is not listed: the code uses it to test a
// secret for a public prefix ("Bearer ", "st_"), which leaks nothing.
var shortCircuit = map[string]bool{
	"bytes.Equal": true, "bytes.EqualFold": true, "bytes.Compare": true,
	"strings.EqualFold": true, "strings.Compare": true,
	"reflect.DeepEqual": true, "slices.Equal": true, "slices.Compare": true,
}

func TestConstantTime(t *testing.T) {
	root := filepath.Join("..", "..", "..", "..")
	byDir := map[string][]secretRule{}
	var dirs []string
	for _, r := range secretRules {
		if byDir[r.dir] == nil {
			dirs = append(dirs, r.dir)
		}
		byDir[r.dir] = append(byDir[r.dir], r)
	}
	checked := 0
	for _, dir := range dirs {
		fset := token.NewFileSet()
		files := parseDir(t, fset, filepath.Join(root, dir))
		if len(files) == 0 {
			t.Errorf("%s: no Go files; the rules name a package that moved", dir)
			continue
		}
		checked += len(files)
		for _, v := range scanSecrets(fset, files, byDir[dir]) {
			t.Errorf("%s/%s", dir, v)
		}
		// The rules must not go stale: every function they name exists and
		// every name they list occurs where they say.
		for _, r := range byDir[dir] {
			for _, fn := range r.funcs {
				if !declares(files, fn) {
					t.Errorf("%s: rule for %v names function %s, which is gone", dir, r.names, fn)
				}
			}
			for _, n := range r.names {
				if !mentions(files, r.funcs, n) {
					t.Errorf("%s: rule names %q (%s) in %v, which never occurs there: update secretRules", dir, n, r.what, r.funcs)
				}
			}
		}
	}
	for _, m := range mustCompareConstantTime {
		fset := token.NewFileSet()
		if !callsWith(parseDir(t, fset, filepath.Join(root, m.dir)), m.fn, m.call, m.args) {
			t.Errorf("%s: %s no longer calls %s(%s)", m.dir, m.fn, m.call, strings.Join(m.args, ", "))
		}
	}
	t.Logf("%d source files in %d packages scanned for non-constant-time comparisons of secrets", checked, len(dirs))
}

// The scanner catches what it must, and only that: a planted violation of
// each kind is reported at its line; presence checks, comparisons of the
// same names outside the function they are secrets in, and the
// constant-time call are not.
func TestConstantTimeScannerCatchesPlanted(t *testing.T) {
	const src = `package planted

import (
	"bytes"
	"crypto/subtle"
	str "strings"
)

func CheckPassword(encoded, password string) bool {
	got, want := []byte(password), []byte(encoded)
	if string(got) != string(want) { // FLAG
		return false
	}
	if bytes.Equal(got[:], want) { // FLAG
		return true
	}
	if str.EqualFold(password, "Hunter2") { // FLAG
		return true
	}
	switch encoded { // FLAG
	case "backdoor":
		return true
	}
	if (password) == "" || len(want) == 0 || encoded != "" || got == nil {
		return false
	}
	if password[0] == ' ' {
		return false
	}
	return subtle.ConstantTimeCompare(got, want) == 1
}

type session struct{ Token string }

func lookup(s session, presented string) bool {
	return s.Token == presented // FLAG
}

func sameUser(a, b session) bool {
	return a.Token != b.Token // FLAG
}

func notSecret(got, want string) bool {
	return got == want
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "planted.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	rules := []secretRule{
		{dir: "planted", names: []string{"password", "encoded", "Token"}},
		{dir: "planted", funcs: []string{"CheckPassword"}, names: []string{"got", "want"}},
	}
	var want []string
	for i, line := range strings.Split(src, "\n") {
		if strings.HasSuffix(line, "// FLAG") {
			want = append(want, "planted.go:"+strconv.Itoa(i+1))
		}
	}
	var got []string
	for _, v := range scanSecrets(fset, []*ast.File{f}, rules) {
		got = append(got, v[:strings.Index(v, ": ")])
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations at %v; want exactly %v\n%s", got, want, strings.Join(scanSecrets(fset, []*ast.File{f}, rules), "\n"))
	}
	if !callsWith([]*ast.File{f}, "CheckPassword", "crypto/subtle.ConstantTimeCompare", []string{"got", "want"}) {
		t.Error("callsWith did not find subtle.ConstantTimeCompare(got, want) in CheckPassword")
	}
	if callsWith([]*ast.File{f}, "notSecret", "crypto/subtle.ConstantTimeCompare", []string{"got", "want"}) {
		t.Error("callsWith found the constant-time call in a function that does not make it")
	}
}

func parseDir(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, filepath.Base(p), src, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// scanSecrets returns "file:line: what" for every comparison of a secret
// in files that is not constant-time.
func scanSecrets(fset *token.FileSet, files []*ast.File, rules []secretRule) []string {
	var out []string
	for _, f := range files {
		imports := importNames(f)
		for _, d := range f.Decls {
			fn := ""
			if fd, ok := d.(*ast.FuncDecl); ok {
				fn = fd.Name.Name
			}
			secret := map[string]bool{}
			for _, r := range rules {
				if r.funcs == nil || slices.Contains(r.funcs, fn) {
					for _, n := range r.names {
						secret[n] = true
					}
				}
			}
			report := func(n ast.Node, format string, args ...any) {
				p := fset.Position(n.Pos())
				out = append(out, fmt.Sprintf("%s:%d: %s", p.Filename, p.Line, fmt.Sprintf(format, args...)))
			}
			ast.Inspect(d, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BinaryExpr:
					if n.Op != token.EQL && n.Op != token.NEQ {
						return true
					}
					for _, pair := range [][2]ast.Expr{{n.X, n.Y}, {n.Y, n.X}} {
						if name, ok := secretOperand(pair[0], secret); ok && !emptyValue(pair[1]) {
							report(n, "%s compared with %s: use crypto/subtle.ConstantTimeCompare", name, n.Op)
							break
						}
					}
				case *ast.SwitchStmt:
					if name, ok := secretOperand(n.Tag, secret); ok {
						for _, c := range n.Body.List {
							if cc := c.(*ast.CaseClause); slices.ContainsFunc(cc.List, func(e ast.Expr) bool { return !emptyValue(e) }) {
								report(n, "switch on %s compares it with ==: use crypto/subtle.ConstantTimeCompare", name)
								break
							}
						}
					}
				case *ast.CallExpr:
					if callee := qualified(n.Fun, imports); shortCircuit[callee] {
						for _, a := range n.Args {
							if name, ok := secretOperand(a, secret); ok {
								report(n, "%s(%s): stops at the first difference; use crypto/subtle.ConstantTimeCompare", callee, name)
								break
							}
						}
					}
				}
				return true
			})
		}
	}
	return out
}

// secretOperand reports whether e is (a conversion, slice, dereference or
// parenthesisation of) a secret: an identifier, a field or a call of a
// function whose name is in secret.
func secretOperand(e ast.Expr, secret map[string]bool) (string, bool) {
	for {
		switch x := e.(type) {
		case *ast.ParenExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		case *ast.UnaryExpr:
			e = x.X
		case *ast.SliceExpr:
			e = x.X
		case *ast.Ident:
			return x.Name, secret[x.Name]
		case *ast.SelectorExpr:
			return x.Sel.Name, secret[x.Sel.Name]
		case *ast.CallExpr:
			if isConversion(x) {
				e = x.Args[0]
				continue
			}
			switch f := x.Fun.(type) {
			case *ast.Ident:
				return f.Name + "()", secret[f.Name]
			case *ast.SelectorExpr:
				return f.Sel.Name + "()", secret[f.Sel.Name]
			}
			return "", false
		default:
			return "", false
		}
	}
}

// isConversion: string(x), []byte(x) and the like.
func isConversion(c *ast.CallExpr) bool {
	if len(c.Args) != 1 {
		return false
	}
	switch f := c.Fun.(type) {
	case *ast.ArrayType:
		return true
	case *ast.Ident:
		return f.Name == "string" || f.Name == "byte" || f.Name == "rune"
	}
	return false
}

// emptyValue: an empty string literal (interpreted or raw) or nil: a
// presence check, which leaks nothing.
func emptyValue(e ast.Expr) bool {
	switch x := e.(type) {
	case *ast.BasicLit:
		return x.Kind == token.STRING && (x.Value == `""` || x.Value == "``")
	case *ast.Ident:
		return x.Name == "nil"
	}
	return false
}

// importNames maps a file's local package names to import paths.
func importNames(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		m[name] = path
	}
	return m
}

// qualified is "path.Name" for a call of an imported package's function
// (the path's last element for the standard library names in
// shortCircuit: "bytes.Equal"), else "".
func qualified(fun ast.Expr, imports map[string]string) string {
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	pkg, ok := sel.X.(*ast.Ident)
	if !ok || imports[pkg.Name] == "" {
		return ""
	}
	return imports[pkg.Name] + "." + sel.Sel.Name
}

func declares(files []*ast.File, fn string) bool {
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == fn {
				return true
			}
		}
	}
	return false
}

// mentions: name occurs as an identifier in funcs (nil: anywhere in files).
func mentions(files []*ast.File, funcs []string, name string) bool {
	found := false
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); funcs != nil && (!ok || !slices.Contains(funcs, fd.Name.Name)) {
				continue
			}
			ast.Inspect(d, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok && id.Name == name {
					found = true
				}
				return !found
			})
		}
	}
	return found
}

// callsWith: function fn calls call ("import/path.Name") with exactly the
// identifiers args.
func callsWith(files []*ast.File, fn, call string, args []string) bool {
	found := false
	for _, f := range files {
		imports := importNames(f)
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != fn {
				continue
			}
			ast.Inspect(fd, func(n ast.Node) bool {
				c, ok := n.(*ast.CallExpr)
				if !ok || qualified(c.Fun, imports) != call || len(c.Args) != len(args) {
					return true
				}
				for i, a := range c.Args {
					if id, ok := a.(*ast.Ident); !ok || id.Name != args[i] {
						return true
					}
				}
				found = true
				return false
			})
		}
	}
	return found
}
