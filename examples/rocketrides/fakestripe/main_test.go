package fakestripe_test

import (
	"testing"

	"idemd/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }
