"""the precision a video rendered at, on its render's cost records (engine.levers.precision: fp32, bf16, int8, ...)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('cost_records') as batch:
        batch.add_column(sa.Column('precision', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('cost_records') as batch:
        batch.drop_column('precision')
