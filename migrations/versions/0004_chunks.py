"""long videos in chunks: per-unit frames, readiness and checkpoint; per-video chunk count, seam score, review

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('work_units') as batch:
        batch.add_column(sa.Column('frames', sa.Integer(), nullable=False, server_default='0'))
        batch.add_column(sa.Column('ready', sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column('checkpoint', sa.Text(), nullable=True))
    # Every unit so far is a whole video: its frames are the video's.
    op.execute("UPDATE work_units SET frames = (SELECT frames FROM videos WHERE videos.id = work_units.video_id)")
    with op.batch_alter_table('videos') as batch:
        batch.add_column(sa.Column('chunks', sa.Integer(), nullable=False, server_default='1'))
        batch.add_column(sa.Column('chunk_overlap', sa.Integer(), nullable=False, server_default='0'))
        batch.add_column(sa.Column('seam_score', sa.Float(), nullable=True))
        batch.add_column(sa.Column('needs_review', sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('videos') as batch:
        batch.drop_column('needs_review')
        batch.drop_column('seam_score')
        batch.drop_column('chunk_overlap')
        batch.drop_column('chunks')
    with op.batch_alter_table('work_units') as batch:
        batch.drop_column('checkpoint')
        batch.drop_column('ready')
        batch.drop_column('frames')
