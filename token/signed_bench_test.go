package token_test

import (
	"context"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/token"
)

// BenchmarkSigned is a signed token's mint and its check, what a request
// of the service's default configuration pays for its submit token.
func BenchmarkSigned(b *testing.B) {
	tk := token.New(nil, &token.Options{Key: []byte(strings.Repeat("k", 32))})
	ctx := context.Background()
	is, err := tk.Issue(ctx, "u_01a2502445bf1033fa042b28e012", "withdrawal")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Issue", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := tk.Issue(ctx, "u_01a2502445bf1033fa042b28e012", "withdrawal"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := tk.Verify(is.Token, "u_01a2502445bf1033fa042b28e012", "withdrawal"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("VerifyParallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := tk.Verify(is.Token, "u_01a2502445bf1033fa042b28e012", "withdrawal"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
