package idemgrpc_test

import (
	"os"
	"strings"
	"testing"
)

// docs/adapters-grpc.md's one-screen example is ExampleUnaryClientInterceptor's
// body, unindented: the example that go test runs is the one users read.
func TestDocExample(t *testing.T) {
	ex, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/adapters-grpc.md")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(ex), "func ExampleUnaryClientInterceptor() {\n")
	if !ok {
		t.Fatal("example_test.go has no ExampleUnaryClientInterceptor")
	}
	body, _, _ = strings.Cut(body, "\n}\n")
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	if want := "```go\n" + strings.Join(lines, "\n") + "\n```\n"; !strings.Contains(string(doc), want) {
		t.Errorf("docs/adapters-grpc.md does not hold ExampleUnaryClientInterceptor's body:\n%s", want)
	}
}
