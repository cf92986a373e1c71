// Package articletest gives tests a database that started from the
// article's schema (migrations.ArticleSchema: response_body JSONB,
// idempotency_key CHECK <= 100 characters) and was then migrated with
// `idemctl migrate` but not adopted: the database of an API that took
// idemd on without `idemctl migrate --adopt-article-schema`.
package articletest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/migrations"
)

// UserID is the article's one user, inserted with the schema.
const UserID = 1

// NewDatabase creates the database, drops it when the test ends, and
// returns its URL as dbtest.RuntimeRole (dbtest.MigratorURL gives the
// migrator's, which owns every table, the article's included, as
// docs/operations.md asks before `idemctl migrate`).
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	admin := dbtest.ServerURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idemd_article_" + hex.EncodeToString(b)
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE DATABASE " + pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("articletest: create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			tb.Logf("articletest: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Logf("articletest: drop database %s: %v", name, err)
		}
	})
	dbURL := dbtest.WithDatabase(admin, name)
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		tb.Fatalf("articletest: %v", err)
	}
	if err := setUp(ctx, dbtest.MigratorURL(dbURL)); err != nil {
		tb.Fatalf("articletest: %v", err)
	}
	return dbtest.RuntimeURL(dbURL)
}

func setUp(ctx context.Context, migratorURL string) error {
	conn, err := pgx.Connect(ctx, migratorURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, migrations.ArticleSchema+
		fmt.Sprintf("INSERT INTO users (id, email) VALUES (%d, 'rider@example.com');", UserID)); err != nil {
		return fmt.Errorf("article schema: %w", err)
	}
	pool, err := pgxpool.New(ctx, migratorURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		return fmt.Errorf("idemctl migrate on the article's schema: %w", err)
	}
	return nil
}
